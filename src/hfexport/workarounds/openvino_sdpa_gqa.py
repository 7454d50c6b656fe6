"""OpenVINO: a grouped-query SDPA (``enable_gqa=True``) gets its key/value heads repeated before conversion.

Where there is no mask, transformers passes ``enable_gqa=True`` to ``scaled_dot_product_attention`` with fewer key
/value heads than query heads (``integrations/sdpa_attention.py``: PE-Audio, GLM-ASR and Moonshine-Streaming
encoders), and OpenVINO's PyTorch frontend has no rule for that form: "cannot convert
aten.scaled_dot_product_attention.default". Before conversion, each such node reads its keys and values through
``repeat_interleave(heads // kv_heads, dim=1)`` (what transformers' own ``repeat_kv`` computes) and loses the flag.
Drop it once the frontend converts ``enable_gqa``.
"""

from __future__ import annotations

from typing import Any

from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["repeat_grouped_heads"]


def repeat_grouped_heads(program: Any) -> int:
    """Repeat the key/value heads of every ``enable_gqa`` SDPA of ``program``; returns how many nodes changed."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _repeat_heads)


def _repeat_heads(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import traced

    if node.target is not torch.ops.aten.scaled_dot_product_attention.default or not node.kwargs.get("enable_gqa"):
        return False
    query, key, value = (traced(x) for x in node.args[:3])
    heads, groups = query.shape[1], key.shape[1]
    if not (isinstance(heads, int) and isinstance(groups, int)) or heads % groups:
        return False
    repeated = []
    for arg, val in zip(node.args[1:3], (key, value)):
        if heads == groups:
            repeated.append(arg)
            continue
        with graph.inserting_before(node):
            rep = graph.call_function(torch.ops.aten.repeat_interleave.self_int, (arg, heads // groups, 1))
        rep.meta["val"] = val.repeat_interleave(heads // groups, 1)
        repeated.append(rep)
    node.args = (node.args[0], *repeated, *node.args[3:])
    node.kwargs = {k: v for k, v in node.kwargs.items() if k != "enable_gqa"}
    return True


@workaround(
    id="openvino-sdpa-gqa",
    backend="openvino",
    target="openvino.convert_model (aten.scaled_dot_product_attention with enable_gqa=True)",
    breaks="a grouped-query SDPA without a mask (PE-Audio, GLM-ASR, Moonshine-Streaming encoders) does not "
    "convert: 'cannot convert aten.scaled_dot_product_attention.default'",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_program_before_convert(repeat_grouped_heads)
