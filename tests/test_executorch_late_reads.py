"""bounds.cap_late_reads: the sizes read from tensors that ``to_edge`` / ``to_executorch`` traced again as new,
unbounded symbols get a finite upper bound before memory planning, which needs one for every planned size.

The three shapes of the failure the matrix met (IDEFICS 2, Inkling 2 / Cosmos-3 Edge, Nemotron-H Omni: "Cannot
evaluate a finite upper bound for symbolic expression ... (int_oo)"), each on a tensor spec built from a shape
environment as the trace leaves it, evaluated by ExecuTorch's own ``eval_upper_bound`` before and after.
"""

from __future__ import annotations

import pytest
import sympy
import torch
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges

pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")

from executorch.exir.sym_util import eval_upper_bound  # noqa: E402

from hfexport.backends.executorch.bounds import LENGTH_FLOOR, cap_late_reads  # noqa: E402


def _reads(count: int, lower=0, upper=int_oo):
    env = ShapeEnv()
    reads = [env.create_unbacked_symint() for _ in range(count)]
    for read in reads:
        env.var_to_range[read.node.expr] = ValueRanges(lower, upper)
    return env, reads


def _graph(size: torch.SymInt, env: ShapeEnv) -> torch.fx.GraphModule:
    """One node whose value is a tensor of ``[size, 4]``, as the planner meets it."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(shape_env=env):
        value = torch.empty(size, 4)
    graph = torch.fx.Graph()
    node = graph.placeholder("x")
    node.meta["val"] = value
    graph.output(node)
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("build, planned", [
    (lambda: (lambda env, u: (u[0] * 3, env))(*_reads(1)), 3 * LENGTH_FLOOR),  # a read, unbounded (IDEFICS 2)
    (lambda: (lambda env, u: (u[0] // u[1], env))(*_reads(2)), LENGTH_FLOOR),  # divided by a read that may be 0
    (lambda: (lambda env, u: (u[0] * u[0], env))(*_reads(1, lower=-int_oo, upper=8)), 64),  # squared, no lower bound
], ids=["unbounded", "divided-by-a-read", "squared"])
def test_a_size_read_again_gets_a_finite_upper_bound(build, planned):
    size, env = build()
    with pytest.raises(RuntimeError, match="Cannot evaluate a finite upper bound"):
        eval_upper_bound(size)  # as the planner failed
    caps = cap_late_reads(_graph(size, env))
    assert eval_upper_bound(size) == planned
    assert all(cap == LENGTH_FLOOR for cap in caps.values())


def test_a_read_with_a_finite_bound_keeps_it():
    env, (read,) = _reads(1, lower=1, upper=16)
    assert cap_late_reads(_graph(read * 2, env)) == {}
    assert eval_upper_bound(read * 2) == 32
    assert env.var_to_range[read.node.expr] == ValueRanges(1, 16)
    assert isinstance(read.node.expr, sympy.Symbol)
