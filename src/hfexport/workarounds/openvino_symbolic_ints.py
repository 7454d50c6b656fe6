"""OpenVINO: the size arithmetic the PyTorch frontend has no rule for, rewritten with the arithmetic it has.

The frontend converts ``operator.add``/``sub``/``mul``/``floordiv`` of symbolic sizes, but not ``operator.pow`` (a
size squared: Video-LLaMA 3's vision tower, MiniMax-M3-VL), which becomes a product, nor ``operator.mod``
(Mamba-2's chunked scan, ``pad = (chunk - seq_len % chunk) % chunk``: Bamba, Mamba-2, Falcon-H1, Nemotron-H,
Zamba-2, GraniteMoE-Hybrid prefill graphs) nor ``torch.sym_min`` / ``torch.sym_max`` (GLM5-Next, MPT, the
DeepSeek-V3.2-like indexers): "No conversion rule found for operations: <built-in function mod>". Before conversion a
``mod`` of sizes becomes ``a - (a // b) * b`` (Python's floor modulo, the same integer), and a ``sym_min`` /
``sym_max`` whose order the shape ranges decide becomes the winning operand (``capture.graph_passes
.resolve_sym_min_max``). One the ranges leave open (an unbounded dynamic length against a constant: the V3.2-like
indexers' ``min(index_topk, kv_len)``, MPT's ``max(0, bias_len - query_len)``) is computed with the four operators
the frontend has: ``below = (2**22 - 1 + b - a) // 2**22`` is 1 where ``a < b`` and 0 otherwise, for sizes under
2**22, so ``min(a, b) = b + (a - b) * below`` and ``max(a, b) = a + b - min(a, b)``. The numerator is kept
non-negative and under 2**24 because the converted division is not Python's exact integer floor: a negative
numerator truncated (``-3 // 2**62`` gave 0) and a large one rounded (``(2**30 - 2) // 2**30`` gave 1, as a float32
division would). Drop it once the frontend converts them (openvino 2026.3 does not). (Sizes made floats:
:mod:`.openvino_symbolic_floats`.)
"""

from __future__ import annotations

import operator
from functools import partial
from typing import Any

from ..capture.graph_passes import rewrite_nodes, sym_mod_as_floordiv, sym_pow_as_products
from .openvino_convert import rewrite_decomposed_programs, rewrite_program_before_convert
from .registry import undo_all, workaround

__all__ = ["sym_mod_as_floordiv"]  # (from capture.graph_passes, shared with ExecuTorch's workaround)


# more than any size: (_FAR - 1 + b - a) // _FAR is 1 where a < b and 0 where a >= b (numerator in [0, 2**23))
_FAR = 2**22


def _min_max_as_arithmetic(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import call_with_value, traced

    if node.target not in (torch.sym_min, torch.sym_max) or len(node.args) != 2:
        return False
    a, b = node.args
    va, vb = traced(a), traced(b)
    if not all(isinstance(v, (int, torch.SymInt)) for v in (va, vb)):
        return False
    call = partial(call_with_value, graph)
    with graph.inserting_before(node):
        gap = call(operator.sub, (b, a), vb - va)
        shifted = call(operator.add, (gap, _FAR - 1), gap.meta["val"] + _FAR - 1)
        below = call(operator.floordiv, (shifted, _FAR), shifted.meta["val"] // _FAR)
        difference = call(operator.sub, (a, b), va - vb)
        step = call(operator.mul, (difference, below), difference.meta["val"] * below.meta["val"])
        result = call(operator.add, (b, step), torch.sym_min(va, vb))
        if node.target is torch.sym_max:
            total = call(operator.add, (a, b), va + vb)
            result = call(operator.sub, (total, result), node.meta.get("val"))
    node.replace_all_uses_with(result)
    graph.erase_node(node)
    return True


def _rewrite(program: Any) -> int:
    from ..capture.graph_passes import resolve_sym_min_max

    return (sym_mod_as_floordiv(program) + resolve_sym_min_max(program)
            + rewrite_nodes(program, _min_max_as_arithmetic) + sym_pow_as_products(program))


@workaround(
    id="openvino-symbolic-ints",
    backend="openvino",
    target="openvino.convert_model (operator.mod, operator.pow, torch.sym_min, torch.sym_max of sizes in an "
    "ExportedProgram)",
    breaks="a graph with size arithmetic the PyTorch frontend has no rule for does not convert: 'No conversion rule "
    "found for operations: <built-in function mod>' (Mamba-2 chunked scans), torch.sym_min (GLM5-Next)",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    # (a pow also comes back from the frontend's own decomposition: the runtime asserts' size expressions)
    return undo_all([rewrite_program_before_convert(_rewrite),
                     rewrite_decomposed_programs(sym_pow_as_products)])
