"""OpenVINO: a query row whose attention mask is all False gives zeros, as in torch, instead of NaN.

torch's ``scaled_dot_product_attention`` returns zeros for a query that may attend to nothing (a left-padding
position of the prompt); OpenVINO's ``ScaledDotProductAttention`` returns NaN there. The NaN keys/values of those
positions then sit in the cache, masked out, and ``0 * NaN`` turns every later step of that row into NaN (greedy
tokens of a left-padded batch collapse to id 0). This wraps ``openvino.convert_model`` so that the output of every
``ScaledDotProductAttention`` with a boolean mask is ``where(mask.any(-1), out, 0)``. Drop it once OpenVINO's SDPA
follows torch on fully masked rows.
"""

from __future__ import annotations

from typing import Any

from .openvino_convert import rewrite_model_after_convert
from .registry import workaround

__all__ = ["zero_fully_masked_rows"]


def zero_fully_masked_rows(model: Any) -> int:
    """Rewrite ``model`` (an ``openvino.Model``) in place; returns how many attention ops were wrapped."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    count = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "ScaledDotProductAttention" or node.get_input_size() < 4:
            continue
        mask = node.input_value(3)
        if mask.get_element_type() != ov.Type.boolean:
            continue
        out = node.output(0)
        consumers = list(out.get_target_inputs())
        any_key = ops.reduce_logical_or(mask, ops.constant(np.int64(-1)), keep_dims=True)
        zero = ops.constant(np.array(0, dtype=out.get_element_type().to_dtype()))
        safe = ops.select(any_key, out, zero)
        for consumer in consumers:
            consumer.replace_source_output(safe.output(0))
        count += 1
    if count:
        model.validate_nodes_and_infer_types()
    return count


@workaround(
    id="openvino-sdpa-masked-rows",
    backend="openvino",
    target="openvino.convert_model (ScaledDotProductAttention)",
    breaks="OpenVINO's SDPA returns NaN for a fully masked query row (torch: zeros); the NaN reaches the cache "
    "and a left-padded row then decodes NaN logits (tokens all 0)",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_model_after_convert(zero_fully_masked_rows)
