"""ONNX: translate ``scaled_dot_product_attention`` to ``Attention`` when a head count is symbolic.

torch.onnx's opset-23 translation of SDPA checks ``query.shape[1] == key.shape[1]`` on the ONNX shapes before it
emits an ``Attention`` node. With ``dynamic=True`` a cache's head axis can stay symbolic while the query's is a
number (T5's cross-attention cache in its decode graph), so the check compares ``4`` with ``s12``, fails, and the
export stops ("SDPA (MHA) requires q_num_heads = kv_num_heads") although the heads are equal at run time (torch's
SDPA would have refused the call otherwise). This translation emits the same ``Attention`` node without that check;
``Attention`` reads the head counts from the runtime shapes. Drop this once the translation compares symbolic dims.

(A mask that broadcasts over the queries is expanded before, by the ``onnx-attention-mask-rows`` workaround: ONNX
Runtime's requirement, not torch.onnx's.)
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["sdpa_as_attention"]


def sdpa_as_attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """``aten.scaled_dot_product_attention`` (inference: no dropout) as one ONNX ``Attention`` (opset >= 23)."""
    from onnxscript.onnx_opset import opset23 as op

    if dropout_p:
        raise ValueError("scaled_dot_product_attention with dropout cannot be exported for inference")
    if is_causal and attn_mask is not None:
        raise ValueError("scaled_dot_product_attention: is_causal and attn_mask cannot both be set")
    outputs = op.Attention(query, key, value, attn_mask, scale=scale, is_causal=int(is_causal))
    return outputs[0] if isinstance(outputs, tuple | list) else outputs


@workaround(
    id="onnx-sdpa-symbolic-heads",
    backend="onnx",
    target="torch.onnx._internal.exporter._torchlib.ops.nn.aten_scaled_dot_product_attention_23",
    breaks="an SDPA whose key has a symbolic head axis fails to export ('SDPA (MHA) requires q_num_heads = "
    "kv_num_heads'): T5 and Whisper decode graphs with dynamic=True",
    upstream=None,
    versions={"torch": ">=2.9,<2.14"},
)
def _apply(model: Any, inputs: dict):
    import torch

    from ..backends.onnx.translations import register_translation

    return register_translation(torch.ops.aten.scaled_dot_product_attention.default, sdpa_as_attention, 23)
