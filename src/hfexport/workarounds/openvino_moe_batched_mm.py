"""OpenVINO: run MoE experts as ``batched_mm`` instead of ``grouped_mm`` while exporting.

transformers picks the ``grouped_mm`` experts implementation by default (``torch._grouped_mm``, or its
``transformers::grouped_mm_fallback`` custom op on CPU, with ``aten.histc`` to count tokens per expert). OpenVINO's
PyTorch frontend has no conversion rule for any of the three ("No conversion rule found for operations:
aten.empty_permuted.default, aten.histc.default, transformers.grouped_mm_fallback.default"). ``batched_mm`` computes
the same experts with ``bmm``, which it converts. The model's own choice is put back on exit. Drop it once the
frontend converts grouped matmuls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import Workaround, register_workaround


def _applies(model: Any, inputs: dict) -> bool:
    can_set = getattr(model, "_can_set_experts_implementation", None)
    if not callable(can_set) or not can_set() or not callable(getattr(model, "get_experts_implementation", None)):
        return False
    return getattr(model.config, "_experts_implementation_internal", None) == "grouped_mm"


def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    before = model.get_experts_implementation()
    model.set_experts_implementation("batched_mm")
    return lambda: model.set_experts_implementation(before)


register_workaround(
    Workaround(
        id="openvino-moe-batched-mm",
        backend="openvino",
        target="transformers.PreTrainedModel.set_experts_implementation",
        breaks="MoE experts traced as grouped_mm (transformers::grouped_mm_fallback, aten.histc) have no OpenVINO "
        "conversion rule",
        upstream=None,
        versions={"openvino": ">=2024.0,<2027"},
        apply=_apply,
        applies=_applies,
    )
)
