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
    from ..capture.graph_passes import narrow_squeezes

    return narrow_squeezes(program, lambda size: not (isinstance(size, int) and size != 1))


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
