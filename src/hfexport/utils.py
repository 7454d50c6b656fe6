"""Lower-level functions behind the exporters (import path kept as in the spec: ``hfexport.utils``)."""

from .capture.decompose import decompose_prefill_decode
from .capture.split import decompose_for_generation
from .capture.multimodal import decompose_multimodal, is_multimodal
from .capture.prepare import patch_model_config, prepare_for_export, register_export_input_preparer
from .pytrees import get_leaf_tensors

__all__ = [
    "decompose_for_generation",
    "decompose_prefill_decode",
    "decompose_multimodal",
    "is_multimodal",
    "get_leaf_tensors",
    "prepare_for_export",
    "patch_model_config",
    "register_export_input_preparer",
]
