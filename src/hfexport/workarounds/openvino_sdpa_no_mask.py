"""OpenVINO: an SDPA without a mask gets an explicit zero mask of rank 4 before conversion.

Where a decode step calls ``scaled_dot_product_attention`` with its one query, no mask and ``is_causal=False``
(Kosmos-2's text model, LongT5's decoder: nothing to hide), OpenVINO's PyTorch frontend gives the
``ScaledDotProductAttention`` op a scalar constant mask. The CPU plugin fuses a stateful export's attention with its
cache into ``ScaledDotProductAttentionWithKVCache``, whose shape inference then rejects the scalar at the first
decode step: "attention_mask do not match q and k ... attn_mask_dims:(1)" (openvino 2026.3.1,
``src/plugins/intel_cpu/src/shape_inference/custom/scaled_attn.cpp``). Adding a ``[batch, 1, 1, keys]`` zero is
the same attention (a ``[1, 1, 1, 1]`` one converts and runs, but the fused node's second decode step then went
wrong). Drop it once the plugin broadcasts a scalar mask.
"""

from __future__ import annotations

from typing import Any

from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["explicit_zero_masks"]

_MASK, _CAUSAL = 3, 5  # positions of attn_mask and is_causal in aten.scaled_dot_product_attention's schema


def explicit_zero_masks(program: Any) -> int:
    """Give every mask-less, non-causal SDPA of one query in ``program`` a ``[batch, 1, 1, keys]`` zero mask; returns
    how many."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _zero_mask)


def _arg(node: Any, index: int, name: str) -> Any:
    return node.args[index] if len(node.args) > index else node.kwargs.get(name)


def _zero_mask(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import call_with_value, traced

    if node.target is not torch.ops.aten.scaled_dot_product_attention.default:
        return False
    if _arg(node, _MASK, "attn_mask") is not None or _arg(node, _CAUSAL, "is_causal"):
        return False
    query, key = traced(node.args[0]), traced(node.args[1])
    if query.dim() != 4 or not (isinstance(query.shape[2], int) and query.shape[2] == 1):
        return False  # (a decode step's one query only: an encoder's or a prompt's attention is never fused with a
    aten = torch.ops.aten  # cache, and keeps its mask-less form)
    # [batch, 1, 1, keys]: one zero per key, shaped from the keys themselves (a [1, 1, 1, 1] mask converts and runs,
    # but the fused node's second decode step then went wrong; a zeros() of symbolic sizes does not convert); the
    # keys' dtype is the query's (SDPA takes one dtype)
    one = key[:, :1, :, :1]
    with graph.inserting_before(node):
        heads = call_with_value(graph, aten.slice.Tensor, (node.args[1], 1, 0, 1), key[:, :1])
        first = call_with_value(graph, aten.slice.Tensor, (heads, 3, 0, 1), one)
        row = call_with_value(graph, aten.transpose.int, (first, 2, 3), one.transpose(2, 3))
        zero = call_with_value(graph, aten.zeros_like.default, (row,), torch.zeros_like(one.transpose(2, 3)))
    # (query, key and value are always positional: the mask is the fourth argument, or a keyword)
    node.args = (*node.args[:_MASK], zero, *node.args[_MASK + 1:])
    node.kwargs = {k: v for k, v in node.kwargs.items() if k != "attn_mask"}
    return True


@workaround(
    id="openvino-sdpa-no-mask",
    backend="openvino",
    target="openvino.convert_model (aten.scaled_dot_product_attention without attn_mask)",
    breaks="a stateful export whose attention has no mask fails at its first decode step in the CPU plugin's fused "
    "attention with cache: 'attention_mask do not match q and k ... attn_mask_dims:(1)'",
    upstream="openvino src/plugins/intel_cpu/src/shape_inference/custom/scaled_attn.cpp; no issue known",
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_program_before_convert(explicit_zero_masks)
