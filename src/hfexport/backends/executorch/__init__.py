"""The ExecuTorch backend: ``torch.export`` -> edge dialect lowered to XNNPACK / CUDA / MLX -> ``.pte``.

Modules, one concern each:

- :mod:`.targets`: the three ExecuTorch backends: machine checks before tracing, partitioners, edge config.
- :mod:`.lowering`: ``to_edge_transform_and_lower`` and ``to_executorch`` with the config's memory planning.
- :mod:`.state`: a static cache kept in the program as mutable buffers.
- :mod:`.custom_sdpa`: that cache written by ``llama::update_cache`` and attended by ``llama::custom_sdpa``, where valid.
- :mod:`.delegable`: rewrites of the traced program so XNNPACK takes a whole layer (rotate_half, RMSNorm mean, views).
- :mod:`.weights`: a tied weight stored once (the weights in a ``.ptd`` beside the ``.pte``).
- :mod:`.shared`: the weights of an export's programs (prefill and decode) stored once, in one shared ``model.ptd``.
- :mod:`.exporter` / :mod:`.runner`: the backend's ``HfExporter`` and ``ModelRunner`` (``executorch.runtime``).
"""

from .exporter import ExecutorchExporter
from .runner import ExecutorchRunner

__all__ = ["ExecutorchExporter", "ExecutorchRunner"]
