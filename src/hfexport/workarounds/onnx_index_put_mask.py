"""ONNX: ``x[mask] = rows`` with a boolean mask and one row per masked position writes those rows, as torch does.

torchlib's ``_aten_index_put_bool`` (onnxscript/function_libs/torch_lib/ops/core.py) converts
``index_put(self, [mask], values)`` to ``Where(mask, values, self)``: right when ``values`` broadcasts to ``self``
(a scalar, one row for all), wrong when it holds one row per masked position (``[count, hidden]``, what
``x[mask] + v`` gives): the ``Where`` then fails to broadcast at run time ("BroadcastIterator::Append ... axis == 1
|| axis == largest") or, where the count happens to broadcast, mixes rows. Qwen3-VL-style deepstack layers do exactly
that (``hidden_states[visual_pos_masks, :] = hidden_states[visual_pos_masks, :] + visual_embeds``: Granite Docling,
Qwen3-VL once its vision tower taps a layer). A single boolean index whose values have the rank of the masked rows
is written here with ``ScatterND`` at the mask's ``NonZero`` positions, the values expanded to ``[count, ...]``;
every other ``index_put`` goes to torchlib's own. Drop it once torchlib scatters compact values.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["index_put"]


def index_put(self: Any, indices: Any, values: Any, accumulate: bool = False) -> Any:
    """``aten.index_put``: one row of ``values`` per set position of a boolean mask (``ScatterND``), else torchlib's
    conversion."""
    from onnxscript import BOOL
    from onnxscript.function_libs.torch_lib.ops.core import aten_index_put
    from onnxscript.onnx_opset import opset18 as op

    mask = indices[0] if len(indices) == 1 else None
    boolean = mask is not None and mask.dtype == BOOL.dtype
    ranks = [getattr(t, "shape", None) for t in (self, mask, values)] if boolean else [None]
    if accumulate or not boolean or any(r is None for r in ranks):
        return aten_index_put(self, indices, values, accumulate)
    self_rank, mask_rank, values_rank = (len(r) for r in ranks)
    if values_rank <= self_rank - mask_rank:  # broadcast over every masked position: torchlib's Where is right
        return aten_index_put(self, indices, values, accumulate)
    positions = op.Transpose(op.NonZero(mask), perm=[1, 0])  # [count, mask rank]
    count = op.Gather(op.Shape(positions), op.Constant(value_ints=[0]), axis=0)
    rest = op.Slice(op.Shape(self), op.Constant(value_ints=[mask_rank]), op.Constant(value_ints=[self_rank]))
    rows = op.Expand(values, op.Concat(count, rest, axis=0))
    return op.ScatterND(self, positions, rows)


@workaround(
    id="onnx-index-put-mask-rows",
    backend="onnx",
    target="onnxscript.function_libs.torch_lib.ops.core._aten_index_put_bool",
    breaks="x[mask] = rows (one row per masked position, a deepstack layer's hidden_states[visual_pos_masks] = ...) "
    "becomes Where(mask, rows, x), which fails to broadcast at run time or mixes rows",
    upstream=None,
    versions={"onnxscript": "<=0.7.0"},
)
def _apply(model: Any, inputs: dict):
    import torch

    from ..backends.onnx.translations import register_translation

    return register_translation(torch.ops.aten.index_put.default, index_put)
