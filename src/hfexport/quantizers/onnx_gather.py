"""Quantized embedding lookups in a quantized ONNX model: gather the int8 rows, then dequantize only those.

A quantizer that stores an embedding table as int8 behind a per-row ``DequantizeLinear`` (NNCF's backup mode, our own
:func:`~.onnx_weights.int8_weight_only`) leaves ``Gather(DequantizeLinear(table), ids)``: every call dequantizes the
whole table (SmolLM2: 28M values per decode step) to read a few rows. :func:`gather_before_dequantize` rewrites it
as ``Gather`` of the int8 rows, their scales and zero points, then ``(rows - zero) * scale``.

A model with tied input and output embeddings (SmolLM2, Llama 3.2 1B) gets two quantized copies of the same matrix:
the table, and the lm_head's transposed ``[hidden, vocab]`` weight, quantized per vocabulary column. When the two hold
the same codes, scales and zero points, the lookup gathers its columns from the lm_head's copy (a ``Transpose`` of
the gathered rows only) and the table's copy is dropped: one int8 copy on disk, as the fp32 export shares one tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["gather_before_dequantize", "add_initializer"]


def _per_row_dequantize(node: Any) -> tuple[Any, Any, Any] | None:
    """``(codes, scale, zero_point)`` initializers of a per-row (axis 0) ``DequantizeLinear`` of a 2-D table."""
    if node is None or node.op_type != "DequantizeLinear" or node.domain not in ("", "ai.onnx"):
        return None
    if "block_size" in node.attributes:
        return None
    codes, scale = node.inputs[0], node.inputs[1]
    zero = node.inputs[2] if len(node.inputs) > 2 else None
    values = [v for v in (codes, scale, zero) if v is not None]
    if any(v.const_value is None for v in values) or len(codes.const_value.shape) != 2:
        return None
    axis = node.attributes["axis"].value if "axis" in node.attributes else 1
    if axis % 2 != 0 or tuple(scale.const_value.shape) != (codes.const_value.shape[0],):
        return None
    return codes, scale, zero


def _transposed_twin(graph: Any, codes: Any, scale: Any, zero: Any) -> tuple[Any, Any, Any] | None:
    """Another per-column ``DequantizeLinear`` whose codes are ``codes`` transposed, with equal scales and zero
    points (a tied lm_head's copy of the embedding table), as its ``(codes, scale, zero)``."""
    rows, cols = codes.const_value.shape
    for node in graph:
        if node.op_type != "DequantizeLinear" or node.inputs[0] is codes:
            continue
        other = node.inputs[0]
        if other is None or other.const_value is None or tuple(other.const_value.shape) != (cols, rows):
            continue
        axis = node.attributes["axis"].value if "axis" in node.attributes else 1
        other_zero = node.inputs[2] if len(node.inputs) > 2 else None
        if axis % 2 != 1 or "block_size" in node.attributes or (zero is None) != (other_zero is None):
            continue
        same = np.array_equal(node.inputs[1].const_value.numpy(), scale.const_value.numpy()) and (
            zero is None or np.array_equal(other_zero.const_value.numpy(), zero.const_value.numpy())
        ) and np.array_equal(other.const_value.numpy().T, codes.const_value.numpy())
        if same:
            return other, node.inputs[1], other_zero
    return None


def add_initializer(graph: Any, name: str, data: np.ndarray) -> Any:
    """``data`` registered as the initializer ``name`` of ``graph``; its value."""
    import onnx_ir as ir

    value = ir.Value(name=name, shape=ir.Shape(data.shape), type=ir.TensorType(ir.DataType.from_numpy(data.dtype)),
                     const_value=ir.tensor(data, name=name))
    graph.register_initializer(value)
    return value


def gather_before_dequantize(model: Any) -> int:
    """Rewrite each ``Gather(DequantizeLinear(table), ids)`` (axis 0, per-row scales) of ``model`` (an
    ``onnx_ir.Model``, in place) to dequantize the gathered rows only, reading a tied lm_head's transposed int8 copy
    instead of its own where the two are the same codes. Returns how many lookups were rewritten."""
    import onnx_ir as ir

    graph = model.graph
    count = 0
    for node in list(graph):
        if node.op_type != "Gather" or node.domain not in ("", "ai.onnx"):
            continue
        if ("axis" in node.attributes and node.attributes["axis"].value != 0) or node.inputs[0] is None:
            continue
        dq = node.inputs[0].producer()
        found = _per_row_dequantize(dq)
        if found is None:
            continue
        codes, scale, zero = found
        ids = node.inputs[1]
        twin = _transposed_twin(graph, codes, scale, zero)
        tag = f"{node.name or 'gather'}_q"
        new: list[Any] = []

        def add(op: str, inputs: list[Any], **attributes: Any) -> Any:
            made = ir.node(op, inputs, attributes=attributes, name=f"{tag}_{op.lower()}_{len(new)}")
            new.append(made)
            return made.outputs[0]

        if twin is not None:  # columns of the lm_head's [hidden, vocab] copy: [hidden, *ids] -> [*ids, hidden]
            codes, scale, zero = twin
            rank = len(ids.shape) if ids.shape is not None else 2
            rows = add("Transpose", [add("Gather", [codes, ids], axis=1)], perm=[*range(1, rank + 1), 0])
        else:
            rows = add("Gather", [codes, ids], axis=0)
        last_axis = add_initializer(graph, f"{tag}_last_axis", np.array([-1], dtype=np.int64))
        float_type = scale.const_value.dtype
        values = add("Cast", [rows], to=float_type)
        if zero is not None:
            offsets = add("Cast", [add("Unsqueeze", [add("Gather", [zero, ids], axis=0), last_axis])], to=float_type)
            values = add("Sub", [values, offsets])
        out = add("Mul", [values, add("Unsqueeze", [add("Gather", [scale, ids], axis=0), last_axis])])
        out.type, out.shape = node.outputs[0].type, node.outputs[0].shape
        graph.insert_before(node, new)
        ir.convenience.replace_all_uses_with(node.outputs[0], out)
        if node.outputs[0].is_graph_output():
            continue  # (not a case a quantizer produces: the lookup's output feeds the model)
        graph.remove(node, safe=True)
        if not dq.outputs[0].uses():
            graph.remove(dq, safe=True)
        count += 1
    for name in [n for n, v in graph.initializers.items() if not v.uses() and not v.is_graph_output()]:
        del graph.initializers[name]
    return count
