"""Packed projections: ``MatMul``s of one input by constant weights become one ``MatMul`` and a ``Split``.

The query/key/value projections of an attention layer (and the gate/up projections of a gated MLP) read the same
hidden states: one matmul over the concatenated weights reads the activations once and launches one kernel instead
of three (or two); the ``Split`` outputs are the original projections, so every consumer is unchanged.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx_ir as ir

from ._graph import Editor, replace

__all__ = ["pack_sibling_matmuls"]


def _constant_weight(node: ir.Node) -> ir.Value | None:
    weight = node.inputs[1]
    if weight is None or weight.const_value is None or weight.shape is None or len(weight.shape) != 2:
        return None
    return weight


def pack_sibling_matmuls(model: ir.Model) -> int:
    """Pack every group of two or more sibling matmuls; returns how many matmuls were merged away."""
    graph = model.graph
    groups: dict[tuple, list[ir.Node]] = defaultdict(list)
    for node in graph:
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
            continue
        weight = _constant_weight(node)
        if weight is not None:
            groups[(id(node.inputs[0]), weight.shape[0], weight.dtype)].append(node)
    merged = 0
    for nodes in groups.values():
        if len(nodes) < 2:
            continue
        weights = [n.inputs[1].const_value.numpy() for n in nodes]
        editor = Editor(graph)
        packed = editor.const(np.concatenate(weights, axis=1))
        first = nodes[0]  # collected in graph order: the packed matmul goes where the first one was
        product = editor.op("MatMul", [first.inputs[0], packed])
        sizes = editor.const([w.shape[1] for w in weights], np.int64)
        parts = editor.op("Split", [product, sizes], axis=-1, outputs=len(nodes))
        editor.commit(first)
        for node, part in zip(nodes, parts):
            part.type, part.shape = node.outputs[0].type, node.outputs[0].shape
            replace(node.outputs[0], part)
        merged += len(nodes) - 1
    if merged:
        graph.sort()
    return merged
