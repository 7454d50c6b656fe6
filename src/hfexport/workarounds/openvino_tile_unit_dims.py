"""OpenVINO: a ``repeat`` that tiles two or more dims of static size 1 of a dynamic tensor becomes an ``expand``.

OpenVINO 2026.3's CPU plugin computes ``Tile`` wrongly where its input is partly dynamic and two of its static
size-1 dims are tiled: ``Parameter [?,1,1,?]`` tiled by ``[1, 4, 8, 1]`` gives ``[0, 4, 2, 0, 4, 2, ...]`` for rows
``[0, 1, 2, 3, 4, 5]`` (the same Tile on ``[2,1,1,6]`` or on ``[?,?,?,?]`` is right; a repro on raw opset13 ops is in
``tests/test_openvino_frontend_gaps.py``). Grounding DINO's decoder builds its text mask as
``mask[:, None, None, :].repeat(1, heads, queries, 1)``: the padded row attended to the wrong text positions
(last_hidden_state 2e-2 from eager). Tiling a size-1 dim is broadcasting it, so before conversion such a node
becomes ``expand`` (a ``Broadcast``) of those dims, followed by a ``repeat`` of the other dims where some are tiled.
Drop it once the CPU plugin tiles such shapes right.
"""

from __future__ import annotations

from typing import Any

from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["expand_unit_tiles"]


def expand_unit_tiles(program: Any) -> int:
    """Rewrite every ``aten.repeat`` of ``program`` that tiles two or more static size-1 dims; returns how many."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _expand)


def _expand(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import call_with_value, traced

    if node.target is not torch.ops.aten.repeat.default:
        return False
    value, repeats = traced(node.args[0]), list(node.args[1])
    if not isinstance(value, torch.Tensor) or len(repeats) != value.dim() or not all(
            isinstance(r, int) for r in repeats):
        return False
    unit = [i for i, (size, r) in enumerate(zip(value.shape, repeats)) if isinstance(size, int) and size == 1 and r > 1]
    if len(unit) < 2:
        return False
    sizes = [r if i in unit else -1 for i, r in enumerate(repeats)]
    rest = [1 if i in unit else r for i, r in enumerate(repeats)]
    with graph.inserting_before(node):
        expanded = call_with_value(graph, torch.ops.aten.expand.default, (node.args[0], sizes), value.expand(sizes))
        if any(r > 1 for r in rest):
            expanded = call_with_value(graph, torch.ops.aten.repeat.default, (expanded, rest),
                                       value.expand(sizes).repeat(rest))
    node.replace_all_uses_with(expanded)
    graph.erase_node(node)
    return True


@workaround(
    id="openvino-tile-unit-dims",
    backend="openvino",
    target="OpenVINO CPU plugin Tile (aten.repeat of two static size-1 dims of a dynamic tensor)",
    breaks="the tiled values come out in the wrong order: Grounding DINO's and MM-Grounding DINO's decoder text mask "
    "(last_hidden_state 2e-2 from eager)",
    upstream=None,
    versions={"openvino": ">=2026.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_program_before_convert(expand_unit_tiles)
