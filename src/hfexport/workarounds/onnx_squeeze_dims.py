"""ONNX: ``squeeze(dim)`` of a dimension that is not 1 stays what torch makes it, a no-op.

torch's ``squeeze(dim)`` leaves a tensor as it is where that dimension's size is not 1. torchlib's
``aten_squeeze_dim`` (onnxscript/function_libs/torch_lib/ops/core.py) emits ``Squeeze(self, [dim])`` whatever the
size, and ONNX's ``Squeeze`` requires the size to be 1, so ONNX Runtime refuses to load the graph ("Node (node_squeeze)
Op (Squeeze) [ShapeInferenceError] Dimension of input 2 must be 1 instead of 3": Parakeet-TDT/RNNT's and Nemotron
ASR's joint network, ``logits.squeeze(2)`` over as many decoder positions as given). In the decomposed program
``torch.onnx`` is about to translate, each ``squeeze.dim`` / ``squeeze.dims`` loses the dimensions its traced input
holds at a static size other than 1, and one left with none becomes an ``alias`` (an ``Identity``). A symbolic size is kept (its
squeeze is the trace's own guess). Drop it once torchlib checks the size the way torch does.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["drop_noop_squeezes"]


def drop_noop_squeezes(program: Any) -> int:
    """Drop from every ``aten.squeeze.dim(s)`` of ``program`` the dimensions whose traced size is a static int other
    than 1 (an ``alias`` of its input when none is left); returns how many nodes changed."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _drop_noop_dims)


def _drop_noop_dims(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import traced

    aten = torch.ops.aten
    if node.target not in (aten.squeeze.dim, aten.squeeze.dims):
        return False
    source = node.args[0]
    value = traced(source)
    if not isinstance(source, torch.fx.Node) or not isinstance(value, torch.Tensor) or value.dim() == 0:
        return False
    dims = node.args[1] if node.target is aten.squeeze.dims else [node.args[1]]
    kept = [d for d in dims if not (isinstance(size := value.shape[d], int) and size != 1)]
    if len(kept) == len(dims):
        return False
    if kept:
        node.target, node.args = aten.squeeze.dims, (source, kept)
    else:  # kept as a node (the program's output names may name it): an ONNX Identity
        node.target, node.args = aten.alias.default, (source,)
    return True


@workaround(
    id="onnx-squeeze-noop",
    backend="onnx",
    target="onnxscript.function_libs.torch_lib.ops.core.aten_squeeze_dim",
    breaks="squeeze(dim) of a dimension that is not 1 (a no-op in torch) becomes an ONNX Squeeze that ONNX Runtime "
    "refuses to load (Parakeet-TDT/RNNT, Nemotron ASR: 'Dimension of input 2 must be 1 instead of 3')",
    upstream=None,
    versions={"onnxscript": "<=0.7.0"},
)
def _apply(model: Any, inputs: dict):
    from ..backends.onnx.translations import around_decomposition

    return around_decomposition(after=drop_noop_squeezes)
