"""ONNX: an int32 index tensor of ``x[index]`` / ``x[index] = v`` made int64 before ``torch.onnx`` translates it.

ATen indexes with int32 or int64 tensors alike. torchlib's ``aten_index`` and ``aten_index_put``
(onnxscript/function_libs/torch_lib/ops/core.py) pass the index on as it is to ``GatherND`` / ``ScatterND``, whose
ONNX schemas take ``tensor(int64)`` indices only, so ONNX Runtime refuses the whole model at load: "Type
'tensor(int32)' of input parameter ... of operator (GatherND) ... is invalid". Molmo 2's image pooling gathers the
patch features with the int32 ``image_token_pooling`` its image processor writes. In the decomposed program
``torch.onnx`` is about to translate, each int32 index of ``aten.index.Tensor`` / ``aten.index_put`` is cast to
int64 (``aten._to_copy``): the same positions. Drop it once torchlib casts the indices it hands to GatherND/ScatterND.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["int64_indices"]


def int64_indices(program: Any) -> int:
    """Cast each int32 index tensor of ``aten.index.Tensor`` / ``aten.index_put`` in ``program`` to int64, in place;
    returns how many nodes changed."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _widen_indices)


def _widen_indices(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import int64_before

    indexing = (torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default)
    if node.target not in indexing or len(node.args) < 2 or not isinstance(node.args[1], list | tuple):
        return False
    indices, changed = list(node.args[1]), False
    for i, index in enumerate(indices):
        if (wide := int64_before(graph, node, index)) is not None:
            indices[i], changed = wide, True
    if changed:
        node.args = (node.args[0], indices, *node.args[2:])
    return changed


@workaround(
    id="onnx-index-dtype",
    backend="onnx",
    target="onnxscript.function_libs.torch_lib.ops.core.aten_index",
    breaks="an int32 index tensor goes to GatherND / ScatterND as it is, which take int64 indices only: ONNX Runtime "
    "refuses the model at load ('Type tensor(int32) of input parameter ... of operator (GatherND) ... is invalid'; "
    "Molmo 2's image pooling)",
    upstream=None,
    versions={"onnxscript": "<=0.7.0"},
)
def _apply(model: Any, inputs: dict):
    from ..backends.onnx.translations import around_decomposition

    return around_decomposition(after=int64_indices)
