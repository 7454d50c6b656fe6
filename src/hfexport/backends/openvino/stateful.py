"""Fold round-tripped state (KV cache, SSM states, static-cache counters) into OpenVINO variables.

A state tensor is a cache input whose new value the graph returns as the cache output of the same name. Each such
pair becomes a ``ReadValue``/``Assign`` variable, so the runtime keeps the cache between ``infer()`` calls instead of
passing it in and out. Before that, every batched state input is routed through a ``Gather`` on its batch axis by a
new ``beam_idx`` input: beam search reorders the cache inside the graph (``arange(batch)`` leaves it as it is).

Nothing is frozen: a static cache's write position comes from the graph's inputs (``cache_position``) or from its
own counter (``cumulative_length``), itself a variable carried from call to call, never a constant of the capture.
"""

from __future__ import annotations

from typing import Any

from ...metadata import ExportMetadata, IORole
from .convert import PRESENT

__all__ = ["state_pairs", "make_stateful", "BEAM_IDX", "variable_id"]

BEAM_IDX = "beam_idx"


def state_pairs(metadata: ExportMetadata) -> dict[str, str]:
    """``{cache input name: cache output name}`` for every tensor the graph round-trips."""
    returned = {s.name for s in metadata.user_outputs if s.role is IORole.CACHE_OUTPUT}
    return {s.name: PRESENT + s.name for s in metadata.inputs if s.role is IORole.CACHE_INPUT and s.name in returned}


def variable_id(input_name: str, output_name: str) -> str:
    """The variable id ``apply_make_stateful_transformation`` gives a pair (the two names joined)."""
    return input_name + output_name


def make_stateful(model: Any, metadata: ExportMetadata) -> dict[str, str]:
    """Turn every state pair of ``model`` into a variable (in place) and add ``beam_idx``; returns the pairs.

    A graph without round-tripped state (an encoder, a prefill that starts from no cache) is left as it is.
    """
    pairs = state_pairs(metadata)
    if not pairs:
        return {}
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    beam_idx = ops.parameter(ov.PartialShape([-1]), ov.Type.i32, name=BEAM_IDX)
    beam_idx.output(0).get_tensor().set_names({BEAM_IDX})
    model.add_parameters([beam_idx])
    axis = ops.constant(np.int64(0))
    for name, out in pairs.items():
        _narrow_int64_state(model, name, out, ov, ops)
        port = model.input(name)
        if port.get_partial_shape().rank.get_length() == 0:
            continue  # a counter (cumulative_length): no batch axis to reorder
        consumers = list(port.get_target_inputs())
        gather = ops.gather(port, beam_idx, axis)
        for consumer in consumers:
            consumer.replace_source_output(gather.output(0))
    model.validate_nodes_and_infer_types()
    apply_make_stateful_transformation(model, pairs)
    return pairs


def _narrow_int64_state(model: Any, name: str, out: str, ov: Any, ops: Any) -> None:
    """Keep an int64 state (a static cache's ``cumulative_length``) as int32: the CPU plugin stores no i64
    variable. The graph still computes in int64 between the two converts."""
    param = model.input(name).get_node()
    if param.get_element_type() != ov.Type.i64:
        return
    port = param.output(0)
    consumers = list(port.get_target_inputs())
    param.set_element_type(ov.Type.i32)
    param.validate_and_infer_types()
    wide = ops.convert(port, ov.Type.i64)
    for consumer in consumers:
        consumer.replace_source_output(wide.output(0))
    result = next(r for r in model.get_results() if out in r.output(0).get_names())
    narrow = ops.convert(result.input_value(0), ov.Type.i32)
    result.input(0).replace_source_output(narrow.output(0))
    result.validate_and_infer_types()
