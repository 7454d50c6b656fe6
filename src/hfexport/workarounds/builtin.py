"""The built-in workarounds: importing this module registers each of them."""

from . import dynamo_sdpa_gqa, onnx_sdpa_gqa, onnx_sdpa_heads, onnx_view_reshape  # noqa: F401
from .models import mamba, qwen2_vl  # noqa: F401
from . import moe_experts, openvino_empty_cat, openvino_sdpa_masked_rows  # noqa: F401
from . import executorch_xnnpack_visitors  # noqa: F401
from . import onnx_dequantize_per_channel  # noqa: F401
from . import quantize_ort_attention, quantize_xnnpack_int_scalars  # noqa: F401
from . import openvino_index_add  # noqa: F401
from . import openvino_repeated_outputs  # noqa: F401
from . import torch_var_keyword_inputs  # noqa: F401
