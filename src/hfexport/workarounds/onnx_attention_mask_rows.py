"""ONNX: an SDPA mask that broadcasts over the queries is expanded to the query length before conversion.

torch's ``scaled_dot_product_attention`` broadcasts its mask; the extended padding mask of LayoutLM and the other
BERT-era encoders is ``[batch, 1, 1, keys]``. torch.onnx passes it to ONNX's ``Attention`` as it is, which the
operator's specification allows (the mask broadcasts to ``[batch, heads, q, keys]``), but ONNX Runtime's CPU kernel
of the opset-23 ``Attention`` (1.32) requires the mask's second-to-last dim to equal the query length and stops at run time: "inconsistent q_sequence_length (between
attn_mask and Q)". Expanding the mask's row axis to the query's length in the program before torch.onnx decomposes
it gives the same attention (a no-op where the mask already has a row per query; a decode step's single query
keeps its one row). Drop it once ONNX Runtime broadcasts the mask's query axis.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["expand_mask_rows", "sdpa_mask", "set_sdpa_mask"]

_MASK = 3  # position of attn_mask in aten.scaled_dot_product_attention's schema


def expand_mask_rows(program: Any) -> int:
    """Expand the ``attn_mask`` of every SDPA of ``program`` whose mask has one row and whose query may have more
    to one row per query, in place; returns how many."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _expand_rows)


def sdpa_mask(node: Any) -> Any:
    """The ``attn_mask`` argument of an ``aten.scaled_dot_product_attention`` node (positional or keyword)."""
    return node.kwargs.get("attn_mask") if len(node.args) <= _MASK else node.args[_MASK]


def set_sdpa_mask(node: Any, mask: Any) -> None:
    """Make ``mask`` the ``attn_mask`` of an SDPA node, where the node passes it."""
    if len(node.args) <= _MASK:
        node.kwargs = {**node.kwargs, "attn_mask": mask}
    else:
        node.args = (*node.args[:_MASK], mask, *node.args[_MASK + 1:])


def _expand_rows(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import call_with_value, traced

    if node.target is not torch.ops.aten.scaled_dot_product_attention.default:
        return False
    mask_node = sdpa_mask(node)
    mask, query = traced(mask_node), traced(node.args[0])
    if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or not isinstance(query, torch.Tensor):
        return False
    rows, queries = mask.shape[-2], query.shape[-2]
    if not (isinstance(rows, int) and rows == 1) or (isinstance(queries, int) and queries == 1):
        return False  # (already a row per query, or a single query: nothing to broadcast)
    aten = torch.ops.aten
    with graph.inserting_before(node):
        length = queries if isinstance(queries, int) else call_with_value(
            graph, aten.sym_size.int, (node.args[0], query.dim() - 2), queries)
        sizes = [-1] * (mask.dim() - 2) + [length, -1]
        expanded = call_with_value(graph, aten.expand.default, (mask_node, sizes),
                                   mask.expand(*([-1] * (mask.dim() - 2)), queries, -1))
    set_sdpa_mask(node, expanded)
    return True


@workaround(
    id="onnx-attention-mask-rows",
    backend="onnx",
    target="onnxruntime Attention (opset 23) CPU kernel: attn_mask of one row for several queries",
    breaks="an SDPA whose mask broadcasts over the queries ([batch, 1, 1, keys]: LayoutLM and other BERT-era "
    "encoders) exports but fails in ONNX Runtime: 'inconsistent q_sequence_length (between attn_mask and Q)'",
    upstream="ONNX Runtime CPU kernel of the ONNX Attention op (opset 23); no issue known",
    versions={"onnxruntime": ">=1.20,<1.33"},
)
def _apply(model: Any, inputs: dict):
    from ..backends.onnx.translations import around_decomposition

    return around_decomposition(before=expand_mask_rows)
