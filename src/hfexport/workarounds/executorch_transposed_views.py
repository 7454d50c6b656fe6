"""ExecuTorch: a view of a transposed tensor that the first trace saw contiguous gets an explicit contiguous copy.

Under ``torch.export`` the fake ``scaled_dot_product_attention`` returns its output laid out as
``[batch, seq, heads, dim]``, so GPT-2's ``attn_output.transpose(1, 2)`` is already contiguous and the ``reshape``
after it is recorded as a ``view``. ``to_edge`` re-traces the program with its decompositions (the math SDPA,
contiguous in ``[batch, heads, seq, dim]``): the transpose is no longer contiguous and the recorded view fails
("Cannot view a tensor with shape torch.Size([2, 6, 64]) and strides (64, 128, 1) as a tensor with shape (12, 64)":
GPT-2, GPT-SW3, JetMoE). Before ``to_edge``, each view (or reshape) whose input is a ``transpose`` / ``permute`` the
first trace recorded as contiguous reads a ``clone(memory_format=contiguous_format)`` of it: a copy where the
runtime's layout needs one, what the view assumed where it does not. Rewriting the views as reshapes does not help
(the failing view is the re-trace's own). Drop it once the re-trace keeps the first trace's layouts.
"""

from __future__ import annotations

from typing import Any

from .executorch_to_edge import rewrite_programs_before_to_edge
from .registry import workaround

__all__ = ["copy_transposed_views"]


def copy_transposed_views(program: Any) -> int:
    """Insert a contiguous ``clone`` between each view/reshape of ``program`` and the transpose or permute it reads
    when that transpose's traced value is contiguous; returns how many."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _copy_before_view)


def _copy_before_view(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import traced

    aten = torch.ops.aten
    if node.target not in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
        return False
    source = node.args[0]
    value = traced(source)
    if not (isinstance(source, torch.fx.Node) and source.target in (aten.transpose.int, aten.permute.default)
            and isinstance(value, torch.Tensor) and value.dim() > 1 and _may_be_contiguous(value)):
        return False
    with graph.inserting_before(node):
        copy = graph.call_function(aten.clone.default, (source,), {"memory_format": torch.contiguous_format})
    copy.meta["val"] = value.clone(memory_format=torch.contiguous_format)
    node.args = (copy, *node.args[1:])
    return True


def _may_be_contiguous(value: Any) -> bool:
    """Whether the traced value may be contiguous: where its sizes are read from tensors, contiguity can be
    undecidable (``is_contiguous`` raised a data-dependent guard on LFM3-VL's patch grid, ``Eq(256*u0*(u1//2)*
    (u2//2), 0)``) and the copy, right either way, is made."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        return bool(value.is_contiguous())
    except GuardOnDataDependentSymNode:
        return True


@workaround(
    id="executorch-transposed-views",
    backend="executorch",
    target="executorch.exir.to_edge_transform_and_lower (its re-trace of views after SDPA's transposed output)",
    breaks="to_edge's re-trace lays out SDPA's output differently from torch.export's, and the view recorded after "
    "its transpose fails (GPT-2, GPT-SW3, JetMoE: 'Cannot view a tensor with shape ... and strides ...')",
    upstream=None,
    versions={"executorch": ">=1.0,<1.6"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_programs_before_to_edge(copy_transposed_views)
