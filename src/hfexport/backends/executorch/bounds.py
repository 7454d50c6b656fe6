"""Finite upper bounds for the dynamic dims of a traced program, which ExecuTorch's memory planning needs.

ExecuTorch plans every tensor at its upper bound, and a ``Dim.AUTO`` dim has none (``int_oo``): its planner then
falls back to the size seen while tracing, and the program refuses any larger input at run time ("Attempted to
resize a bounded tensor"). Before lowering we give each unbounded symbol a cap: a batch dim (dim 0 of a user input)
``max(4 x traced, 8)``, any other ``max(4 x traced, 512)``. An explicit ``dynamic_shapes`` with ``Dim(max=...)``
keeps its own bound.
"""

from __future__ import annotations

import logging

import torch
from torch.utils._sympy.numbers import IntInfinity, int_oo
from torch.utils._sympy.value_ranges import ValueRanges

__all__ = ["cap_dynamic_dims", "BATCH_FLOOR", "LENGTH_FLOOR"]

logger = logging.getLogger(__name__)

BATCH_FLOOR = 8
LENGTH_FLOOR = 512
_GROWTH = 4


def _unbounded(bound) -> bool:
    return bound is int_oo or isinstance(bound, IntInfinity)


def cap_dynamic_dims(program: torch.export.ExportedProgram) -> dict[str, int]:
    """Give every unbounded symbol of ``program`` a finite upper bound, in place; return ``{symbol: cap}``."""
    shape_env, batch = None, set()
    user_inputs = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for dim, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                shape_env = size.node.shape_env
                if dim == 0 and node.name in user_inputs:
                    batch.add(size.node.expr)
    if shape_env is None:
        return {}
    hints = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
    caps = {}
    for symbol, bounds in list(shape_env.var_to_range.items()):
        if not _unbounded(bounds.upper):
            continue
        seen = int(hints.get(symbol, 1))
        cap = max(_GROWTH * seen, BATCH_FLOOR if symbol in batch else LENGTH_FLOOR)
        shape_env.var_to_range[symbol] = ValueRanges(bounds.lower, cap)
        caps[symbol] = cap
    constraints = program.range_constraints
    for symbol, bounds in list(constraints.items()):
        if symbol in caps and _unbounded(bounds.upper):
            constraints[symbol] = ValueRanges(bounds.lower, caps[symbol])
    if caps:
        logger.info("ExecuTorch plans dynamic dims up to: %s (pass dynamic_shapes with Dim(max=...) to choose)",
                    ", ".join(f"{s}<={c}" for s, c in caps.items()))
    return {str(s): c for s, c in caps.items()}
