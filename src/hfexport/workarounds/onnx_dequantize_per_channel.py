"""ONNX: translate ``quantized_decomposed.dequantize_per_channel`` (a PT2E int8 weight) to ``DequantizeLinear``.

torchlib (onnxscript's torch_lib/ops/quantized_decomposed.py) translates only the per-tensor quantize/dequantize
ops, so a graph quantized by PT2E with per-channel weights (X86InductorQuantizer's default, XNNPACKQuantizer with
``is_per_channel=True``) fails in ``torch.onnx.export`` ("No ONNX function found for
quantized_decomposed.dequantize_per_channel"). ``DequantizeLinear`` with ``axis`` is exactly that op; its zero
point must have the input's integer type. Drop this once torchlib registers a per-channel translation.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["dequantize_per_channel"]


def dequantize_per_channel(
    input: Any, scales: Any, zero_points: Any, axis: int, quant_min: int, quant_max: int, dtype: Any,
    out_dtype: Any = None,
) -> Any:
    """``quantized_decomposed.dequantize_per_channel`` as ``DequantizeLinear`` along ``axis``."""
    from onnxscript.onnx_opset import opset18 as op

    if zero_points is None:
        return op.DequantizeLinear(input, scales, axis=axis)
    return op.DequantizeLinear(input, scales, op.CastLike(zero_points, input), axis=axis)


@workaround(
    id="onnx-dequantize-per-channel",
    backend="onnx",
    target="onnxscript.function_libs.torch_lib.ops.quantized_decomposed",
    breaks="a PT2E-quantized graph with per-channel int8 weights cannot be exported to ONNX (no translation "
    "for quantized_decomposed.dequantize_per_channel)",
    upstream=None,
    versions={"onnxscript": "<=0.7.0"},
)
def _apply(model: Any, inputs: dict):
    import torch
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines the quantized_decomposed ops)

    from ..backends.onnx.translations import register_translation

    return register_translation(torch.ops.quantized_decomposed.dequantize_per_channel.default, dequantize_per_channel)
