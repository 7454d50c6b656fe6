"""ONNX: let ``torch.onnx``'s re-trace of the program redo ``view``s as ``reshape``s.

``torch.onnx.export`` first re-traces the program with its decomposition table (``run_decompositions``). The
re-trace computes strides again, and they can differ from the first trace's: under ``torch.export`` the fake
``scaled_dot_product_attention`` returns its output already laid out as ``[batch, seq, heads, dim]``, so T5's
``attn_output.transpose(1, 2).contiguous()`` was a no-op and was dropped; in the re-trace the output is contiguous
in ``[batch, heads, seq, dim]``, the ``view`` that follows meets a non-contiguous tensor and fails ("Cannot view a
tensor with shape ... and strides ..."). ``reshape`` computes the same values and copies only when it must, and both
become an ONNX ``Reshape``: rewriting the program's ``aten.view`` into ``aten.reshape`` before the re-trace fixes
it. Drop this once the re-trace keeps the first trace's layouts.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["views_as_reshapes"]

_MODULE = "torch.onnx._internal.exporter._fx_passes"


def views_as_reshapes(program: Any) -> int:
    """Rewrite every ``aten.view.default`` of ``program`` (and its submodules) into ``aten.reshape.default``."""
    import torch

    from ..capture.graph_passes import program_graphs

    count = 0
    for module, graph in program_graphs(program):
        views = [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.view.default]
        for node in views:
            node.target = torch.ops.aten.reshape.default
        if views and isinstance(module, torch.fx.GraphModule):
            module.recompile()
        count += len(views)
    return count


@workaround(
    id="onnx-view-as-reshape",
    backend="onnx",
    target=f"{_MODULE}.decompose_with_registry",
    breaks="torch.onnx's re-trace lays out SDPA's output differently from torch.export's, and a view of the "
    "transposed output fails (T5: 'Cannot view a tensor with shape ... and strides ...')",
    upstream=None,
    versions={"torch": ">=2.9,<2.14"},
)
def _apply(model: Any, inputs: dict):
    from ..backends.onnx.translations import around_decomposition

    return around_decomposition(before=views_as_reshapes)
