"""ONNX: ``masked_scatter`` with a mask that broadcasts over the last axes (a placeholder mask ``[B, S, 1]`` against
embeddings ``[B, S, H]``) scatters whole rows, as torch does.

torchlib's ``aten_masked_scatter`` (onnxscript/function_libs/torch_lib/ops/core.py) expands the mask to the input's
shape only when the mask has fewer dimensions; a mask of the same rank whose last size is 1 is left as it is, the
input is "expanded" to the mask's shape instead (a no-op), and ``NonZero`` of the narrow mask scatters one element per
masked row (column 0) instead of the row. Every image-text model whose ``get_placeholder_mask`` returns
``special_image_mask.unsqueeze(-1)`` unexpanded (DeepSeek-VL, Aya Vision, ...) merged its image features wrongly in
ONNX (logits off by 0.7-0.9). Both tensors are expanded to their broadcast shape here. Drop it once torchlib
broadcasts the mask.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["masked_scatter"]


def masked_scatter(self: Any, mask: Any, source: Any) -> Any:
    """``aten.masked_scatter``: ``source``'s leading elements, in order, where the broadcast ``mask`` is set."""
    from onnxscript.onnx_opset import opset18 as op

    mask = op.Expand(mask, op.Shape(self))  # (Expand broadcasts both ways: the broadcast shape of the two)
    self = op.Expand(self, op.Shape(mask))
    index = op.Transpose(op.NonZero(mask), perm=[1, 0])
    flat = op.Reshape(source, op.Constant(value_ints=[-1]))
    count = op.Gather(op.Shape(index), op.Constant(value_ints=[0]), axis=0)
    flat = op.Slice(flat, op.Constant(value_ints=[0]), count, op.Constant(value_ints=[0]))
    return op.ScatterND(self, index, flat)


@workaround(
    id="onnx-masked-scatter-broadcast",
    backend="onnx",
    target="onnxscript.function_libs.torch_lib.ops.core.aten_masked_scatter",
    breaks="a masked_scatter whose mask broadcasts over the last axis ([B, S, 1] into [B, S, H]) writes one element "
    "per masked row instead of the row: image-text models merge their image features wrongly",
    upstream=None,
    versions={"onnxscript": "<=0.7.0"},
)
def _apply(model: Any, inputs: dict):
    import torch

    from ..backends.onnx.translations import register_translation

    return register_translation(torch.ops.aten.masked_scatter.default, masked_scatter)
