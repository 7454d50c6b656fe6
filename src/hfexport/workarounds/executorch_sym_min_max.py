"""ExecuTorch: ``torch.sym_max`` / ``torch.sym_min`` of sizes reach ``to_edge`` as the winning operand where the
program's shape ranges decide it.

``max(0, bias.size(1) - query_length)`` (MPT's ALiBi slice) and ``min(index_topk, scores.shape[-1])`` (the
DeepSeek-V3.2 / GLM-MoE-DSA / HY-V4 / AXK2 / Dots3 indexers) trace as ``torch.sym_max`` / ``torch.sym_min``, Python
functions. ExecuTorch maps them to its own prim ops only after its edge verifier ran, and that verifier refuses any
Python function but ``alloc`` (``assert op.__name__ in ("alloc",)``, executorch/exir/verification/verifier.py
``check_valid_edge_op``): a bare ``AssertionError``, so every dynamic decode graph of those families failed. With the
bounds the lowering gives the sizes (``backends/executorch/bounds.py``), the order is known and the node is replaced
by the operand that wins (``capture.graph_passes.resolve_sym_min_max``); an order the ranges leave open is kept, and
fails as before. Drop it once the verifier accepts the Python sym functions it maps itself.
"""

from __future__ import annotations

from typing import Any

from .executorch_to_edge import rewrite_programs_before_to_edge
from .registry import workaround

__all__: list[str] = []


@workaround(
    id="executorch-sym-min-max",
    backend="executorch",
    target="executorch.exir.to_edge_transform_and_lower (EXIREdgeDialectVerifier.check_valid_edge_op)",
    breaks="a dynamic decode graph with max()/min() of sizes (MPT, DeepSeek-V3.2-like indexers) fails in to_edge "
    "with a bare AssertionError: the edge verifier refuses torch.sym_max / torch.sym_min",
    upstream="executorch/exir/verification/verifier.py check_valid_edge_op (only 'alloc' may be a Python function); "
    "no issue known",
    versions={"executorch": ">=1.0,<1.6"},
)
def _apply(model: Any, inputs: dict):
    from ..capture.graph_passes import resolve_sym_min_max

    return rewrite_programs_before_to_edge(resolve_sym_min_max)
