"""ExecuTorch: run MoE experts as ``batched_mm`` instead of ``grouped_mm`` while exporting.

transformers picks the ``grouped_mm`` experts implementation by default (``torch._grouped_mm``, or its
``transformers::grouped_mm_fallback`` custom op on CPU). ExecuTorch has no kernel for either: XNNPACK does not
delegate it, the portable/optimized kernel libraries have no ``_grouped_mm.out``, and MLX has no lowering, so the
edge verifier or the runtime fails on it. ``batched_mm`` computes the same experts with ``bmm``, which every
ExecuTorch backend runs. The model's own choice (``get_experts_implementation()``) is put back on exit. Drop it once
ExecuTorch ships a grouped matmul kernel.
"""

from __future__ import annotations

from .moe_experts import use_batched_mm_experts, uses_grouped_mm_experts
from .registry import Workaround, register_workaround

register_workaround(
    Workaround(
        id="executorch-moe-batched-mm",
        backend="executorch",
        target="transformers.PreTrainedModel.set_experts_implementation",
        breaks="MoE experts traced as grouped_mm (torch._grouped_mm / transformers::grouped_mm_fallback) have no "
        "ExecuTorch kernel: XNNPACK does not delegate them and the portable kernels lack _grouped_mm.out",
        upstream=None,
        versions={"executorch": ">=1.0,<1.6"},
        apply=use_batched_mm_experts,
        applies=uses_grouped_mm_experts,
    )
)
