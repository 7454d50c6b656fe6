"""ExecuTorch: a slice whose bound is read from a tensor lowers, as a read that is a size within the sliced dim.

``x[:n]`` with ``n`` read from a tensor (``n = mask.sum(1)[i]``: LFM2-VL unpads each image's features to its patch
count) traces to ``aten.slice(x, 0, None, u0)``, ``u0`` unbacked, of unknown sign, and the slice's length a new
unbacked symbol of its own. ``to_edge`` traces the program again, through torch's Python decomposition
``slice_forward`` (torch/_decomp/decompositions.py, torch 2.13), which asks ``if end_val < 0`` of the read ("Could
not guard on data-dependent expression u88 < 0"), and once it may not, gives the length as ``Min(size, u)``, which
the retrace cannot bind to the first trace's symbol ("should have been constant, but got Min(s54, u4)"). Before
``to_edge`` each read a slice takes as its start or end is declared a size (``sym_constrain_range_for_size``) and
checked at most the sliced dim (``_assert_scalar``: the retrace replays both as facts; ExecuTorch drops the checks
from the program), and the slice's own length symbol goes (its length is the read). Where both bounds are read
(MiniCPM-V's packed images, ``features[0, start : start + count]``), the end is also checked at least the start, which
the retrace asks next ("u74 < u73"); the length is then ``end - start``. ``to_edge`` retraces three times, and the
first can still give such a length a symbol of its own (a trace with the sample's real values, MiniCPM-o-OCR's),
which the second, knowing the checks, computes as ``end - start`` and cannot bind ("should have been constant, but
got -u21 + u22"): each retrace first forgets those slices' length symbols. A slice of a prefix whose end is a count,
or of a packed run between two offsets, as in every model seen, computes the same. Drop it once ``slice_forward``
decides with ``guard_or_false``.
"""

from __future__ import annotations

import operator
from typing import Any

from .executorch_to_edge import rewrite_programs_before_to_edge
from .registry import patch_attribute, undo_all, workaround

__all__ = ["declare_slice_reads_sizes", "assert_ordered", "forget_slice_lengths"]


def _is_read(value: Any) -> bool:
    """Whether ``value`` is a graph node reading a tensor's value (``_local_scalar_dense``, ``item``)."""
    import torch

    return isinstance(value, torch.fx.Node) and value.target in (torch.ops.aten._local_scalar_dense.default,
                                                                  torch.ops.aten.item.default)


def assert_ordered(graph: Any, node: Any) -> bool:
    """Check, before the slice ``node``, that its end is at least its start where both are read from tensors
    (MiniCPM-V's packed images, ``features[0, start : start + count]``: without it the retrace asks ``end < start``);
    whether it did."""
    import torch

    start, end = (list(node.args[2:4]) + [None, None])[:2]
    if not (_is_read(start) and _is_read(end)):
        return False
    with graph.inserting_before(node):
        ordered = graph.call_function(operator.le, (start, end))
        graph.call_function(torch.ops.aten._assert_scalar.default,
                            (ordered, "a slice's end read from a tensor is before its start"))
    return True


def _read_slices(graph: Any) -> list:
    """The ``aten.slice.Tensor`` nodes of ``graph`` with a bound read from a tensor."""
    import torch

    return [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.slice.Tensor
            and any(_is_read(b) for b in n.args[2:4])]


def forget_slice_lengths(program: Any) -> int:
    """Drop the length symbol that each slice bounded by a read got from the last trace (its ``unbacked_bindings``),
    in place; returns how many. A trace that could not yet order the bounds gives the length a symbol of its own, and
    the next one, knowing the checks, computes ``end - start``, which torch cannot bind to that symbol ("should have
    been constant, but got -u21 + u22": ``to_edge`` retraces three times)."""
    from ..capture.graph_passes import program_graphs

    return sum(node.meta.pop("unbacked_bindings", None) is not None
               for _, graph in program_graphs(program) for node in _read_slices(graph))


def declare_slice_reads_sizes(program: Any) -> int:
    """Declare each tensor read (``_local_scalar_dense``, ``item``) that an ``aten.slice.Tensor`` of ``program``
    takes as its start or end a size, at most the sliced dim, in place; returns how many bounds."""
    import torch

    from ..capture.graph_passes import program_graphs

    declared = 0
    for module, graph in program_graphs(program):
        sized = set()
        for node in _read_slices(graph):
            source, dim = node.args[0], node.args[1] if len(node.args) > 1 else 0
            for bound in node.args[2:4]:
                if not _is_read(bound):
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
            assert_ordered(graph, node)
        if sized:
            module.recompile()
    return declared


@workaround(
    id="executorch-slice-read-bounds",
    backend="executorch",
    target="torch/_decomp/decompositions.py slice_forward (run by executorch's to_edge retrace)",
    breaks="a slice whose bound is read from a tensor fails to lower: 'Could not guard on data-dependent expression "
    "u88 < 0' (LFM2-VL's image features, unpadded to each image's patch count), 'u74 < u73' (MiniCPM-V's packed "
    "images, sliced between two offsets read from tensors)",
    upstream=None,
    versions={"torch": ">=2.8,<2.14"},
)
def _apply(model: Any, inputs: dict):
    from torch.export import ExportedProgram

    original = vars(ExportedProgram)["run_decompositions"]

    def run_decompositions(self: Any, *args: Any, **kwargs: Any) -> Any:
        forget_slice_lengths(self)  # (before each of to_edge's retraces)
        return original(self, *args, **kwargs)

    return undo_all([rewrite_programs_before_to_edge(declare_slice_reads_sizes),
                     patch_attribute(ExportedProgram, "run_decompositions", run_decompositions)])
