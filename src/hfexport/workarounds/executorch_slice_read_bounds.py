"""ExecuTorch: a slice whose bound is read from a tensor lowers, as a read that is a size within the sliced dim.

``x[:n]`` with ``n`` read from a tensor (``n = mask.sum(1)[i]``: LFM2-VL unpads each image's features to its patch
count) traces to ``aten.slice(x, 0, None, u0)``, ``u0`` unbacked, of unknown sign, and the slice's length a new
unbacked symbol of its own. ``to_edge`` traces the program again, through torch's Python decomposition
``slice_forward`` (torch/_decomp/decompositions.py, torch 2.13), which asks ``if end_val < 0`` of the read ("Could
not guard on data-dependent expression u88 < 0"), and once it may not, gives the length as ``Min(size, u)``, which
the retrace cannot bind to the first trace's symbol ("should have been constant, but got Min(s54, u4)"). Before
``to_edge`` each read a slice takes as its start or end is declared a size (``sym_constrain_range_for_size``) and
checked at most the sliced dim (``_assert_scalar``: the retrace replays both as facts; ExecuTorch drops the checks
from the program), and the slice's own length symbol goes (its length is the read). A slice of a prefix whose end is
a count, as in every model seen, computes the same. Drop it once ``slice_forward`` decides with ``guard_or_false``.
"""

from __future__ import annotations

import operator
from typing import Any

from .executorch_to_edge import rewrite_programs_before_to_edge
from .registry import workaround

__all__ = ["declare_slice_reads_sizes"]


def declare_slice_reads_sizes(program: Any) -> int:
    """Declare each tensor read (``_local_scalar_dense``, ``item``) that an ``aten.slice.Tensor`` of ``program``
    takes as its start or end a size, at most the sliced dim, in place; returns how many bounds."""
    import torch

    from ..capture.graph_passes import program_graphs

    reads = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default)
    declared = 0
    for module, graph in program_graphs(program):
        sized = set()
        for node in [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.slice.Tensor]:
            source, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
            for bound in node.args[2:4]:
                if not isinstance(bound, torch.fx.Node) or bound.target not in reads:
                    continue
                if bound not in sized:  # at least 0 (a size: the range the retrace gives its new symbol)
                    with graph.inserting_after(bound):
                        graph.call_function(torch.ops.aten.sym_constrain_range_for_size.default, (bound,))
                    sized.add(bound)
                with graph.inserting_before(node):  # at most the sliced dim (the trace's slice did not clamp it)
                    size = graph.call_function(torch.ops.aten.sym_size.int, (source, dim))
                    within = graph.call_function(operator.le, (bound, size))
                    graph.call_function(torch.ops.aten._assert_scalar.default,
                                        (within, f"a slice bound read from a tensor exceeds {source.name}[{dim}]"))
                node.meta.pop("unbacked_bindings", None)  # (its length is the read now, not a new symbol)
                declared += 1
        if sized:
            module.recompile()
    return declared


@workaround(
    id="executorch-slice-read-bounds",
    backend="executorch",
    target="torch/_decomp/decompositions.py slice_forward (run by executorch's to_edge retrace)",
    breaks="a slice whose bound is read from a tensor fails to lower: 'Could not guard on data-dependent expression "
    "u88 < 0' (LFM2-VL's image features, unpadded to each image's patch count)",
    upstream=None,
    versions={"torch": ">=2.8,<2.14"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_programs_before_to_edge(declare_slice_reads_sizes)
