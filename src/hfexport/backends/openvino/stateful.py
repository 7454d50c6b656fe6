"""Fold round-tripped state (KV cache, SSM states, static-cache counters) into OpenVINO variables.

A state tensor is a cache input whose new value the graph returns as the cache output of the same name. Each such
pair becomes a variable: the input parameter is replaced by a ``ReadValue``, the output result by an ``Assign``, so
the runtime keeps the cache between ``infer()`` calls instead of passing it in and out. Every batched state is read
through a ``Gather`` on its batch axis by a new ``beam_idx`` input: beam search reorders the cache inside the graph
(``arange(batch)`` leaves it as it is).

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
    """``{cache input name: cache output name}`` for every tensor the graph round-trips.

    Empty unless the cache the graph returns is exactly the one it takes: a prefill that builds its cache (a static
    cache allocated on first use returns tensors it never took) hands the whole cache out, to be loaded into the
    decode graph's state, rather than keeping part of it inside.
    """
    returned = {s.name for s in metadata.user_outputs if s.role is IORole.CACHE_OUTPUT}
    taken = {s.name for s in metadata.inputs if s.role is IORole.CACHE_INPUT}
    if not taken or taken != returned:
        return {}
    return {s.name: PRESENT + s.name for s in metadata.inputs if s.role is IORole.CACHE_INPUT}


def variable_id(input_name: str, output_name: str) -> str:
    """The id of the variable that holds the state pair ``(input_name, output_name)``."""
    return input_name


def _settled_shape(taken: Any, traced: list | None) -> Any:
    """The state's shape: the input's, with each dimension torch.export fixed (an int in the metadata's traced shape)
    static. The frontend can leave such a dimension dynamic (Jamba's recurrent state ``[?, ?, ?]`` where the trace
    says ``[batch, 128, 16]``), and the initial value below starts every dynamic dimension other than the batch empty,
    as a growing cache's length does: an initial ``[batch, 0, 0]`` recurrent state then fails the plugin's shape
    check against the ``[batch, 128, 16]`` it is multiplied with (Jamba, Kimi-Linear, Bailing-Hybrid; Bamba and
    Granite-MoE-Hybrid then stop at their chunked scan's reshape)."""
    import openvino as ov

    if traced is None or taken.rank.is_dynamic or taken.rank.get_length() != len(traced):
        return taken
    return ov.PartialShape([ov.Dimension(t) if d.is_dynamic and isinstance(t, int) else d
                            for d, t in zip(taken, traced)])


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
    from openvino.op import assign, read_value
    from openvino.op.util import Variable, VariableInfo

    beam_idx = ops.parameter(ov.PartialShape([-1]), ov.Type.i32, name=BEAM_IDX)
    beam_idx.output(0).get_tensor().set_names({BEAM_IDX})
    model.add_parameters([beam_idx])
    zero = ops.constant(np.int64(0))
    batch = ops.unsqueeze(ops.gather(ops.shape_of(beam_idx, ov.Type.i64), zero, zero), zero)
    # an empty dimension as batch * 0, not a constant 0: a constant would fold into a state fixed at size 0, which
    # then refuses the caller's cache (a conv state [batch, 128, 3] loaded into "[?, 128, 0]")
    empty = ops.multiply(batch, ops.constant(np.array([0], dtype=np.int64)))
    results = {name: r for r in model.get_results() for name in r.output(0).get_names()}
    traced = {s.name: s.shape for s in metadata.inputs}
    batch_dim = (traced.get("input_ids") or traced.get("inputs_embeds") or [None])[0]
    for name, out in pairs.items():
        param, result = model.input(name).get_node(), results[out]
        new_value = result.input_value(0)
        element = param.get_element_type()
        if element == ov.Type.i64:  # the CPU plugin stores no i64 variable (a static cache's cumulative_length)
            element = ov.Type.i32
            new_value = ops.convert(new_value, element).output(0)
        shape = _settled_shape(param.get_partial_shape(), traced.get(name))
        info = VariableInfo()
        info.variable_id, info.data_type, info.data_shape = variable_id(name, out), element, shape
        variable = Variable(info)
        if shape.rank.get_length() == 0:
            state = read_value(variable).output(0)
        else:
            # the CPU plugin compiles no dynamic-shape ReadValue without an initial value: zeros with the batch of
            # beam_idx and every other dynamic dim empty (a growing cache before its first token); the runner loads
            # the caller's cache at each new sequence, so a static cache starts from the caller's zeros
            # (a batch axis that torch.export fixed, as it does for a batch-1 sample, stays that fixed size)
            first = shape[0]
            dims = [ops.constant(np.array([first.get_length()], dtype=np.int64)) if first.is_static else batch]
            dims += [ops.constant(np.array([d.get_length()], dtype=np.int64)) if d.is_static else empty
                     for d in list(shape)[1:]]
            zeros = ops.broadcast(ops.constant(np.array(0, dtype=element.to_dtype())), ops.concat(dims, 0))
            state = read_value(zeros, variable).output(0)
        value = state if element == param.get_element_type() else ops.convert(state, param.get_element_type()).output(0)
        first_traced = (traced.get(name) or [None])[0]
        # a state without a batch axis (xLSTM's seqlen_offset [1] beside a symbolic batch) is not reordered: its
        # gather by beam_idx made it [batch], which its variable then refused ("Can not clone with new dims")
        if shape.rank.get_length() > 0 and not (isinstance(first_traced, int) and isinstance(batch_dim, str)):
            value = ops.gather(value, beam_idx, zero).output(0)
        for target in list(param.output(0).get_target_inputs()):
            target.replace_source_output(value)
        node = new_value.get_node()
        if new_value.get_index() != 0:  # Assign takes a node: its first output
            node = ops.convert(new_value, new_value.get_element_type())
        sink = assign(node, variable)
        model.add_variables([variable])
        model.add_sinks([sink])
        model.remove_result(result)
        model.remove_parameter(param)
    model.validate_nodes_and_infer_types()
    return pairs
