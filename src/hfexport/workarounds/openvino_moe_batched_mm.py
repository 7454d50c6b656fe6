"""OpenVINO: run MoE experts as ``batched_mm`` instead of ``grouped_mm`` while exporting.

transformers picks the ``grouped_mm`` experts implementation by default (``torch._grouped_mm``, or its
``transformers::grouped_mm_fallback`` custom op on CPU, with ``aten.histc`` to count tokens per expert). OpenVINO's
PyTorch frontend has no conversion rule for any of the three ("No conversion rule found for operations:
aten.empty_permuted.default, aten.histc.default, transformers.grouped_mm_fallback.default"). ``batched_mm`` computes
the same experts with ``bmm``, which it converts. The model's own choice is put back on exit. Drop it once the
frontend converts grouped matmuls.
"""

from __future__ import annotations

from .moe_experts import use_batched_mm_experts, uses_grouped_mm_experts
from .registry import Workaround, register_workaround

register_workaround(
    Workaround(
        id="openvino-moe-batched-mm",
        backend="openvino",
        target="transformers.PreTrainedModel.set_experts_implementation",
        breaks="MoE experts traced as grouped_mm (transformers::grouped_mm_fallback, aten.histc) have no OpenVINO "
        "conversion rule",
        upstream=None,
        versions={"openvino": ">=2024.0,<2027"},
        apply=use_batched_mm_experts,
        applies=uses_grouped_mm_experts,
    )
)
