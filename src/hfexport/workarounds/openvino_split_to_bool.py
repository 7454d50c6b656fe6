"""OpenVINO: a piece of an uneven split converted to bool is compared with zero instead.

``torch.split`` with sizes converts to ``VariadicSplit``, ``.bool()`` to ``Convert(boolean)``, and the CPU plugin
cannot compile the two together: ``compile_model`` stops with "While validating node 'opset1::VariadicSplit ...':
Default output not supported" (openvino 2026.3.1; a three-node model reproduces it, while an even ``Split``, or
``VariadicSplit`` followed by any other op, compiles). GLM-5-Next's indexer splits its packed key states into keys,
gate scores and a validity channel and reads the channel with ``.bool()``. Before conversion, each such conversion
of a split piece becomes ``x != 0``: the same values (torch's bool of a number is "not zero", NaN included). Drop it
once the plugin compiles the pair.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ..capture.graph_passes import call_with_value, rewrite_nodes, traced
from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["split_pieces_compared_with_zero"]

_SPLITS = frozenset((torch.ops.aten.split_with_sizes.default, torch.ops.aten.split_with_sizes_copy.default,
                     torch.ops.aten.split.Tensor, torch.ops.aten.split.sizes))


def split_pieces_compared_with_zero(program: Any) -> int:
    """Replace each conversion to bool of a split's piece in ``program`` by ``piece != 0``, in place; returns how
    many."""
    return rewrite_nodes(program, _compare_piece)


def _is_split_piece(node: Any) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is operator.getitem
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].target in _SPLITS)


def _compare_piece(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    if node.target is torch.ops.aten._to_copy.default:
        dtype = node.kwargs.get("dtype")
    elif node.target is torch.ops.aten.to.dtype:
        dtype = node.args[1] if len(node.args) > 1 else node.kwargs.get("dtype")
    else:
        return False
    piece = node.args[0] if node.args else None
    value = traced(piece)
    if dtype is not torch.bool or not _is_split_piece(piece) or not isinstance(value, torch.Tensor) \
            or value.dtype == torch.bool or value.is_complex():
        return False
    with graph.inserting_before(node):
        compared = call_with_value(graph, torch.ops.aten.ne.Scalar, (piece, 0), value != 0)
    node.replace_all_uses_with(compared)
    graph.erase_node(node)
    return True


@workaround(
    id="openvino-split-to-bool",
    backend="openvino",
    target="OpenVINO CPU plugin: VariadicSplit followed by Convert(boolean)",
    breaks="compile_model fails with 'VariadicSplit ...: Default output not supported' where a piece of an uneven "
    "split is converted to bool (GLM-5-Next's indexer validity channel)",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_program_before_convert(split_pieces_compared_with_zero)
