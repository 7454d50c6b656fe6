"""ExecuTorch: an int32 index of ``scatter`` / ``scatter_add`` / ``scatter_reduce`` / ``gather`` made int64.

ATen takes an ``index`` of int32 or int64 (torch >= 2.1); ExecuTorch's edge dialect lists only int64 for it in
these ops' dtype constraints (executorch 1.5.1, exir/dialects/edge/edge.yaml), so ``to_edge``'s verifier refuses the
program ("These operators are taking Tensor inputs with mismatched dtypes: aten.scatter_add.default ... 'index':
torch.int32"). GLM-5-Next builds its sparse-attention mask by scattering into int32 top-k indices. Before
``to_edge``, each such int32 index is cast to int64 (``aten._to_copy``): the same positions, twice the bytes of an
index tensor. Drop it once the edge dialect admits int32 indices.
"""

from __future__ import annotations

from typing import Any

import torch

from ..capture.graph_passes import int64_before, rewrite_nodes
from .executorch_to_edge import rewrite_programs_before_to_edge
from .registry import workaround

__all__ = ["int64_indices"]

# the ops whose third argument is an index (the in-place forms too: the program is not functionalized yet)
_INDEXED = frozenset((
    torch.ops.aten.scatter.src, torch.ops.aten.scatter.value, torch.ops.aten.scatter_.src,
    torch.ops.aten.scatter_.value, torch.ops.aten.scatter_add.default, torch.ops.aten.scatter_add_.default,
    torch.ops.aten.scatter_reduce.two, torch.ops.aten.scatter_reduce_.two, torch.ops.aten.gather.default,
))
_INDEX = 2


def int64_indices(program: Any) -> int:
    """Cast each int32 index of the ops above to int64 in ``program``, in place; returns how many."""
    return rewrite_nodes(program, _widen_index)


def _widen_index(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    if node.target not in _INDEXED or len(node.args) <= _INDEX:
        return False
    wide = int64_before(graph, node, node.args[_INDEX])
    if wide is None:
        return False
    node.args = (*node.args[:_INDEX], wide, *node.args[_INDEX + 1:])
    return True


@workaround(
    id="executorch-int32-index",
    backend="executorch",
    target="executorch exir/dialects/edge/edge.yaml (index dtype constraints of scatter/gather)",
    breaks="to_edge's verifier refuses an int32 index of scatter_add / scatter / gather (SpecViolationError: "
    "mismatched dtypes), which ATen accepts (GLM-5-Next's sparse attention mask)",
    upstream="executorch exir/dialects/edge/edge.yaml; no issue known",
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_programs_before_to_edge(int64_indices)
