"""OpenVINO: a floor division of a size expression that is never positive, rewritten with a non-negative numerator.

A ceiling division of sizes, ``ceil(n / k)``, reaches the graph as ``-((-n) // k)`` (the padded chunk count of
Mamba-2's chunked scan: ``reshape(x, [b, -1, chunk, heads, dim])`` and the einsums over the chunks), and the
PyTorch frontend converts ``operator.floordiv`` of integers as a division that truncates toward zero: ``(-9) // 256``
gives 0, not -1, so the chunk count of a 9-token prompt is 0 and the CPU plugin's Reshape refuses "the shape of
input data (2.256.8.16) conflicts with the reshape pattern (2.0.256.8.16)" (Mamba-2, Bamba, Falcon-H1, Zamba-2,
Granite-MoE-Hybrid, Nemotron-H prefill). The frontend writes those size nodes itself, in the
``ExportedProgram.run_decompositions`` it runs inside ``convert_model`` (a view's sizes re-derived from the shape
expressions), so the rewrite runs on the program that call returns, while ``convert_model`` runs: where the shape
ranges say the numerator ``a`` is never positive and the divisor ``k`` is a positive constant, ``a // k`` becomes
``-((-a + k - 1) // k)``, the same integer with a numerator the frontend divides right. A numerator whose sign the
ranges leave open is kept. Drop it once the frontend floors integer division (openvino 2026.3.1 does not, measured
here: its translation of ``operator.floordiv`` gave 0 for ``(-3) // 8``; the file upstream was not read).
"""

from __future__ import annotations

import operator
from functools import partial
from typing import Any

from .openvino_convert import rewrite_decomposed_programs
from .registry import workaround

__all__ = ["ceil_divisions_as_positive"]


def ceil_divisions_as_positive(program: Any) -> int:
    """Rewrite each ``a // k`` of ``program`` (``k`` a positive int, ``a`` a size expression never positive over the
    shape ranges) as ``-((-a + k - 1) // k)``; returns how many."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _positive_numerator)


def _positive_numerator(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import call_with_value, size_range, traced

    if node.target is not operator.floordiv or len(node.args) != 2:
        return False
    a, k = node.args
    value = traced(a)
    if not isinstance(k, int) or k <= 0 or not isinstance(value, torch.SymInt) or size_range(value)[1] > 0:
        return False
    call = partial(call_with_value, graph)
    with graph.inserting_before(node):
        flipped = call(operator.neg, (a,), -value)
        shifted = call(operator.add, (flipped, k - 1), flipped.meta["val"] + k - 1)
        quotient = call(operator.floordiv, (shifted, k), shifted.meta["val"] // k)
        result = call(operator.neg, (quotient,), node.meta.get("val"))
    node.replace_all_uses_with(result)
    graph.erase_node(node)
    return True


@workaround(
    id="openvino-negative-floordiv",
    backend="openvino",
    target="openvino.convert_model (operator.floordiv of a never-positive size: the ceil divisions -((-n) // k))",
    breaks="the frontend's integer floordiv truncates toward zero: a ceil division of sizes gives 0 chunks and the CPU "
    "plugin's Reshape refuses 'the shape of input data (2.256.8.16) conflicts with the reshape pattern "
    "(2.0.256.8.16)' (Mamba-2 chunked-scan prefill)",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_decomposed_programs(ceil_divisions_as_positive)
