"""ONNX: a ``full`` / ``full_like``-style fill without an explicit dtype keeps the dtype torch gave it.

``torch.full(size, 0)`` is an int64 tensor (torch infers the dtype from the Python fill value), and its traced node
carries no ``dtype`` keyword. torchlib's ``aten_full`` (onnxscript/function_libs/torch_lib/ops/core.py) defaults a
missing dtype to float, so the graph converts and then ONNX Runtime refuses to load it where the fill meets an int64
tensor ("Type parameter (T) of Optype (Where) bound to different types (tensor(int64) and tensor(float)": Idefics2's,
Idefics3's and SmolVLM's patch position ids, ``torch.where(mask, pos_ids, torch.full(..., fill_value=0))``), or
computes in float where torch computed in integers. Each ``aten.full`` of the program ``torch.onnx`` is about to
translate gets the dtype its traced value has. Drop it once torchlib reads the dtype of a fill without one.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["explicit_fill_dtypes"]


def explicit_fill_dtypes(program: Any) -> int:
    """Give every ``aten.full.default`` of ``program`` without a ``dtype`` keyword its traced value's dtype."""
    import torch

    from ..capture.graph_passes import program_graphs

    count = 0
    for module, graph in program_graphs(program):
        for node in graph.nodes:
            value = node.meta.get("val")
            if (node.op == "call_function" and node.target is torch.ops.aten.full.default
                    and node.kwargs.get("dtype") is None and isinstance(value, torch.Tensor)):
                node.kwargs = {**node.kwargs, "dtype": value.dtype}
                count += 1
        if count and isinstance(module, torch.fx.GraphModule):
            module.recompile()
    return count


@workaround(
    id="onnx-full-dtype",
    backend="onnx",
    target="onnxscript.function_libs.torch_lib.ops.core.aten_full",
    breaks="torch.full(size, 0) (int64) becomes a float fill in ONNX: ONNX Runtime refuses the graph where it meets "
    "an int64 tensor (Where bound to int64 and float: Idefics2/3, SmolVLM) or computes in float",
    upstream=None,
    versions={"onnxscript": "<=0.7.0"},
)
def _apply(model: Any, inputs: dict):
    from ..backends.onnx.translations import around_decomposition

    return around_decomposition(after=explicit_fill_dtypes)
