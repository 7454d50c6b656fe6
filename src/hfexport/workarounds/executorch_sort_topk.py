"""ExecuTorch: an unstable sort (``torch.sort``, ``torch.argsort``) traced as the ``topk`` over the whole dimension it
equals.

ExecuTorch's portable kernel library registers no ``aten::sort`` (executorch/kernels/portable/functions.yaml has
``topk.values`` but no ``sort.values``) and XNNPACK delegates no sort, so a program with one lowers and then fails
to load: "Failed to load method forward, error 0x14" (OperatorMissing). Qwen2.5-VL's vision tower (and the models
built on it) reverses its window permutation with ``torch.argsort(window_index)``. A sort that does not ask for
stability returns what ``topk(x, k=x.shape[dim], largest=descending, sorted=True)`` returns (ties in either order,
as torch's own unstable sort): traced that way instead during an ExecuTorch export; a stable sort keeps its
``sort``. Seen with executorch 1.5.1; drop it once the portable kernels register ``sort.values``.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import Undo, patch_attribute, undo_all, workaround

__all__ = ["sort_as_topk"]


def sort_as_topk(x: torch.Tensor, dim: int = -1, descending: bool = False) -> torch.return_types.topk:
    """``(values, indices)`` of ``x`` sorted along ``dim`` (ties in no particular order), through ``topk``."""
    return torch.topk(x, k=x.shape[dim], dim=dim, largest=descending, sorted=True)


def _sort(original: Any) -> Any:
    def sort(x: Any, dim: int = -1, descending: bool = False, stable: bool | None = None, **kwargs: Any) -> Any:
        if stable or kwargs or not isinstance(x, torch.Tensor) or x.dim() == 0 or x.dtype == torch.bool:
            return original(x, dim=dim, descending=descending, stable=stable, **kwargs)
        return sort_as_topk(x, dim, descending)

    return sort


def _argsort(original: Any) -> Any:
    def argsort(x: Any, dim: int = -1, descending: bool = False, stable: bool = False, **kwargs: Any) -> Any:
        if stable or kwargs or not isinstance(x, torch.Tensor) or x.dim() == 0 or x.dtype == torch.bool:
            return original(x, dim=dim, descending=descending, stable=stable, **kwargs)
        return sort_as_topk(x, dim, descending).indices

    return argsort


@workaround(
    id="executorch-sort-as-topk",
    backend="executorch",
    target="torch.sort / torch.argsort (and the Tensor methods) during an ExecuTorch trace",
    breaks="a program with an aten::sort (Qwen2.5-VL's vision tower: argsort of its window index) lowers, then fails "
    "to load: 'Failed to load method forward, error 0x14' (no sort kernel registered)",
    upstream="executorch/kernels/portable/functions.yaml (no sort.values kernel); no issue known",
    versions={"executorch": ">=1.0,<1.6"},
)
def _apply(model: Any, inputs: dict) -> Undo:
    undos = [patch_attribute(torch, "sort", _sort(torch.sort)),
             patch_attribute(torch, "argsort", _argsort(torch.argsort)),
             patch_attribute(torch.Tensor, "sort", _sort(torch.Tensor.sort)),
             patch_attribute(torch.Tensor, "argsort", _argsort(torch.Tensor.argsort))]
    return undo_all(undos)
