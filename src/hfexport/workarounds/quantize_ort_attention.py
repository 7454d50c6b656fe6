"""ONNX Runtime quantization: leave the standard ``Attention`` op alone (it is not ``com.microsoft`` ``Attention``).

``onnxruntime.quantization`` matches ops by type name only (onnxruntime/quantization/registry.py maps
``"Attention"`` to ``AttentionQuant``): ``quantize_dynamic`` turns the opset-23 ``Attention`` of a torch.onnx graph
into ``com.microsoft.QAttention``, whose inputs and attributes differ, and the session then refuses the graph
("Unrecognized attribute: is_causal for operator QAttention"). This makes ``AttentionQuant.should_quantize`` say no
for an ``Attention`` node of the default domain. Applied by ``OnnxRuntimeQuantizer`` around ONNX Runtime's
quantization (never during a trace: ``applies`` wants an ONNX model). Drop it once ONNX Runtime checks the domain.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import patch_attribute, workaround

__all__ = ["is_onnx_model"]

_MODULE = "onnxruntime.quantization.operators.attention"


def is_onnx_model(model: Any, inputs: dict) -> bool:
    """``applies`` of the workarounds around ONNX Runtime's quantization: the model given is an ONNX one."""
    return type(model).__module__.split(".")[0] in ("onnx_ir", "onnx")


@workaround(
    id="onnxruntime-quantize-standard-attention",
    backend="onnx",
    target=f"{_MODULE}.AttentionQuant.should_quantize",
    breaks="quantize_dynamic rewrites the standard ONNX Attention op into com.microsoft QAttention, which "
    "ONNX Runtime then refuses ('Unrecognized attribute: is_causal for operator QAttention')",
    upstream=None,
    versions={"onnxruntime": ">=1.21,<1.33"},
    applies=is_onnx_model,
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    from onnxruntime.quantization.operators.attention import AttentionQuant

    original = AttentionQuant.should_quantize

    def should_quantize(self: Any) -> bool:
        if self.node.domain in ("", "ai.onnx"):
            return False
        return original(self)

    return patch_attribute(AttentionQuant, "should_quantize", should_quantize)
