"""Shared by the backends' MoE workarounds: switch a model's experts from ``grouped_mm`` to ``batched_mm``.

transformers picks the ``grouped_mm`` experts implementation by default; backends without a grouped matmul
(ExecuTorch's kernels, OpenVINO's PyTorch frontend) take ``batched_mm``, which computes the same experts with
``bmm``. Each backend registers its own workaround (its own reason, versions and when to drop it) with these two.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["uses_grouped_mm_experts", "use_batched_mm_experts"]


def uses_grouped_mm_experts(model: Any, inputs: dict) -> bool:
    """Whether ``model`` resolved its experts implementation to ``grouped_mm`` (and can switch it)."""
    can_set = getattr(model, "_can_set_experts_implementation", None)
    if not callable(can_set) or not can_set() or not callable(getattr(model, "get_experts_implementation", None)):
        return False
    # the implementation transformers resolved for this model (``None`` was resolved to grouped_mm or eager)
    return getattr(model.config, "_experts_implementation_internal", None) == "grouped_mm"


def use_batched_mm_experts(model: Any, inputs: dict) -> Callable[[], None]:
    """Switch to ``batched_mm``; the returned undo puts the model's own choice back."""
    before = model.get_experts_implementation()
    model.set_experts_implementation("batched_mm")
    return lambda: model.set_experts_implementation(before)
