"""ExecuTorch: the dim order of a tensor whose strides hold a data-dependent size, where their order is undecided.

``to_executorch`` gives every tensor a dim order by sorting its strides (``exir.tensor.dim_order_from_stride``,
executorch 1.5.1). Its comparison answers what the shape environment knows and then compares the strides for real,
which guards on a data-dependent size: a contiguous ``[X, u, 64]`` has strides ``(64 * u, 64, 1)``, and
``64 * u < 64`` is undecided for an unbacked ``u`` that may be 0 ("GuardOnDataDependentSymNode: Could not guard on
data-dependent expression 64*u67 < 64", in ``dim_order_from_stride``). Idefics2/3 and the other image-text models that
keep only the real images (``pixel_values[real_images_inds]``), GLM-5-Next's top-k attention and V-JEPA 2 stop there.

Where the original raises that, the order is decided with what is known and, between two strides whose order is
not, by position (the earlier dim outer): the order of a contiguous tensor, which is what every tensor of an edge
program is unless a known stride says otherwise (views are copies there; a channels-last layout has known strides).
Both answers agree whenever the size is at least 1, and an empty tensor's layout holds nothing. Drop it once
``dim_order_from_stride`` does not guard on an unbacked size.
"""

from __future__ import annotations

import functools
from typing import Any

from .registry import Undo, patch_attribute, undo_all, workaround

__all__ = ["dim_order_known_or_positional"]

# the modules that call it by a name of their own (imported from exir.tensor)
_CALLERS = ("executorch.exir.tensor", "executorch.exir.tensor_layout", "executorch.exir.emit._emitter",
            "executorch.exir.passes.replace_view_copy_with_view_pass")  # (its _ViewSpec: LFM3-VL's patch grid)


def dim_order_known_or_positional(stride: tuple[Any, ...]) -> tuple[int, ...]:
    """The dims from outermost to innermost: a larger stride first where that is known, else the earlier dim."""
    from torch.fx.experimental.symbolic_shapes import guard_or_false

    def outer_first(a: int, b: int) -> int:
        if guard_or_false(stride[a] > stride[b]):
            return -1
        if guard_or_false(stride[a] < stride[b]):
            return 1
        return -1 if a < b else (1 if a > b else 0)

    return tuple(sorted(range(len(stride)), key=functools.cmp_to_key(outer_first)))


@workaround(
    id="executorch-unbacked-stride-order",
    backend="executorch",
    target="executorch.exir.tensor.dim_order_from_stride",
    breaks="to_executorch's dim order compares strides that hold a data-dependent size and guards on it "
    "(GuardOnDataDependentSymNode: 64*u < 64): Idefics2/3, Granite Docling, ModernVBERT, GLM-5-Next, V-JEPA 2",
    upstream="executorch exir/tensor.py dim_order_from_stride; no issue known",
    versions={"executorch": ">=1.0,<1.6"},
)
def _apply(model: Any, inputs: dict) -> Undo:
    import importlib

    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    original = importlib.import_module("executorch.exir.tensor").dim_order_from_stride

    def dim_order_from_stride(stride: Any) -> Any:
        try:
            return original(stride)
        except GuardOnDataDependentSymNode:
            return dim_order_known_or_positional(tuple(stride))

    return undo_all([patch_attribute(importlib.import_module(name), "dim_order_from_stride", dim_order_from_stride)
                     for name in _CALLERS])
