"""ExecuTorch: a size's ``%`` computed with Python's sign rule, as ``a - (a // b) * b``.

``to_edge`` maps ``operator.mod`` on sizes to ``executorch_prim::mod.Scalar``, whose runtime kernel (executorch
1.5.1) takes C's remainder: ``-6 % 4`` is ``-2`` there and ``2`` in Python, where the program was traced. Padding to
a multiple of a block, ``(-n) % block`` (LongT5's local attention, every "pad to a multiple" in transformers), then
pads by a negative amount ("Padding values must be non-negative, but got pad[3] = -2", error 0x12) or divides by a
block count of zero (the process dies of SIGFPE). ``executorch_prim::floordiv.Scalar`` floors as Python does, so
each size ``a % b`` is rewritten before ``to_edge`` as ``a - (a // b) * b``: the same number for every sign of
``a`` and ``b``. Drop it once ExecuTorch's ``mod.Scalar`` follows Python's rule.
"""

from __future__ import annotations

import operator
from typing import Any

from .executorch_to_edge import rewrite_programs_before_to_edge
from .registry import workaround

__all__ = ["python_size_mod"]


def python_size_mod(program: Any) -> int:
    """Rewrite every ``operator.mod`` of sizes in ``program`` as ``a - (a // b) * b``, in place; returns how many."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _mod_by_floordiv)


def _mod_by_floordiv(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import call_with_value, traced

    if node.target is not operator.mod or len(node.args) != 2:
        return False
    a, b = node.args
    value_a, value_b = traced(a), traced(b)
    if not all(isinstance(v, int | torch.SymInt) for v in (value_a, value_b)):
        return False
    with graph.inserting_before(node):
        quotient = call_with_value(graph, operator.floordiv, (a, b), value_a // value_b)
        product = call_with_value(graph, operator.mul, (quotient, b), (value_a // value_b) * value_b)
        remainder = call_with_value(graph, operator.sub, (a, product), value_a - (value_a // value_b) * value_b)
    node.replace_all_uses_with(remainder)
    graph.erase_node(node)
    return True


@workaround(
    id="executorch-size-mod-sign",
    backend="executorch",
    target="executorch_prim::mod.Scalar (runtime kernel of operator.mod on sizes)",
    breaks="a size computed as (-n) % block is negative in the ExecuTorch runtime: a negative padding fails "
    "(error 0x12) or a block count of zero kills the process with SIGFPE (LongT5's local attention)",
    upstream="executorch kernels/prim_ops/register_prim_ops.cpp mod.Scalar (C remainder); no issue known",
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_programs_before_to_edge(python_size_mod)
