"""Weight-only int8 for the ONNX nodes a quantizer leaves in float, and module-path selection of ONNX nodes.

An int8 recipe keeps some layers' activations in float (the inputs of an MLP's down projection carry the large
outliers of Llama-family models; per-tensor int8 loses them), but their weights still fit int8 per output channel:
:func:`int8_weight_only` stores a ``MatMul`` weight (or an embedding table read by ``Gather``) as int8 with one
fp32 scale per output channel (per row of the table), behind a ``DequantizeLinear``. :func:`nodes_in_modules` finds
nodes by the module path torch.onnx records on each node (``pkg.torch.onnx.name_scopes``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["nodes_in_modules", "int8_weight_only"]


def _module_path(node: Any) -> str:
    scopes = node.metadata_props.get("pkg.torch.onnx.name_scopes")
    if not scopes:
        return ""
    try:
        names = ast.literal_eval(scopes)
    except (ValueError, SyntaxError):
        return ""
    return names[-2] if len(names) >= 2 else ""  # the last entry is the op's own name


def nodes_in_modules(model: Any, patterns: Iterable[str], op_types: tuple[str, ...] = ("MatMul", "Gemm")) -> list[str]:
    """Names of the ``op_types`` nodes whose module path (e.g. ``model.layers.3.mlp.down_proj``) matches one of the
    regular expressions ``patterns`` (``re.search``)."""
    compiled = [re.compile(p) for p in patterns]
    out = []
    for node in model.graph:
        if node.op_type in op_types and node.name:
            path = _module_path(node)
            if path and any(p.search(path) for p in compiled):
                out.append(node.name)
    return out


def _float_weight(node: Any) -> Any:
    index = {"MatMul": 1, "Gather": 0}.get(node.op_type)
    if index is None or len(node.inputs) <= index:
        return None
    value = node.inputs[index]
    if value is None or not value.is_initializer() or value.const_value is None:
        return None
    if value.const_value.dtype.name != "FLOAT" or len(value.const_value.shape) != 2:
        return None
    return value


def int8_weight_only(model: Any, node_names: Iterable[str] | None = None) -> int:
    """Store the float 2-D weight of each named ``MatMul`` (per output column) or ``Gather`` (per table row) as
    symmetric int8 behind a ``DequantizeLinear`` (in place); ``None`` takes every such node. A weight several nodes
    read with the same axis is stored once. Returns how many weights were converted."""
    import onnx_ir as ir

    graph = model.graph
    wanted = None if node_names is None else set(node_names)
    done: dict[tuple[str, int], Any] = {}
    for node in list(graph):
        if wanted is not None and node.name not in wanted:
            continue
        value = _float_weight(node)
        if value is None:
            continue
        axis = 1 if node.op_type == "MatMul" else 0
        index = 1 if node.op_type == "MatMul" else 0
        key = (value.name, axis)
        if key not in done:
            weight = value.const_value.numpy().astype(np.float32)
            scale = np.abs(weight).max(axis=1 - axis) / 127.0
            scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
            shape = (1, -1) if axis == 1 else (-1, 1)
            q = np.clip(np.round(weight / scale.reshape(shape)), -127, 127).astype(np.int8)
            names = (f"{value.name}_int8", f"{value.name}_scale", f"{value.name}_zero")
            tensors = [q, scale, np.zeros_like(scale, dtype=np.int8)]
            inputs = []
            for name, data in zip(names, tensors):
                dtype = ir.TensorType(ir.DataType.from_numpy(data.dtype))
                init = ir.Value(name=name, shape=ir.Shape(data.shape), type=dtype, const_value=ir.tensor(data, name=name))
                graph.register_initializer(init)
                inputs.append(init)
            dq = ir.node("DequantizeLinear", inputs, attributes={"axis": axis}, name=f"{value.name}_dequantize")
            dq.outputs[0].name = f"{value.name}_dequantized"
            dq.outputs[0].type = ir.TensorType(ir.DataType.FLOAT)
            dq.outputs[0].shape = ir.Shape(weight.shape)
            graph.insert_before(node, dq)
            done[key] = dq.outputs[0]
        node.replace_input_with(index, done[key])
    for value_name, _ in done:
        value = graph.initializers.get(value_name)
        if value is not None and not value.uses() and not value.is_graph_output():
            del graph.initializers[value_name]
    return len(done)
