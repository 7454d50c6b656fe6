"""When may ONNX Runtime write a cache output straight into its input's buffer?

Binding an output onto an input's buffer is only sound if every read of the old value happens before the node that
writes the output. ONNX Runtime schedules a node only after its inputs exist, so that holds when every reader of the
input is an ancestor of the writer. Readers are followed through the ops whose CPU kernels may return a view of their
input (``Reshape``, ``Squeeze``, ...), since a view reads the same buffer later. ``Shape``/``Size`` read no data.
"""

from __future__ import annotations

import onnx_ir as ir

__all__ = ["safe_in_place_pairs"]

_VIEW_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Expand"})
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def _readers(value: ir.Value) -> list[ir.Node]:
    found: list[ir.Node] = []
    stack = [value]
    while stack:
        current = stack.pop()
        for use in current.uses():
            node = use.node
            if node.op_type in _SHAPE_ONLY and node.domain == "":
                continue
            found.append(node)
            if node.op_type in _VIEW_OPS and node.domain == "":
                stack.extend(node.outputs)
    return found


def _ancestors(node: ir.Node) -> set[int]:
    seen = {id(node)}
    stack = [node]
    while stack:
        for value in stack.pop().inputs:
            producer = value.producer() if value is not None else None
            if producer is not None and id(producer) not in seen:
                seen.add(id(producer))
                stack.append(producer)
    return seen


def safe_in_place_pairs(
    program: ir.Model, pairs: dict[int, int], in_names: list[str], out_names: list[str]
) -> dict[int, int]:
    """The subset of ``{output index: input index}`` whose output may be written into the input's buffer."""
    graph = program.graph
    inputs = {v.name: v for v in graph.inputs}
    outputs = {v.name: v for v in graph.outputs}
    safe = {}
    for out_index, in_index in pairs.items():
        source, result = inputs.get(in_names[in_index]), outputs.get(out_names[out_index])
        writer = result.producer() if result is not None else None
        if source is None or writer is None or writer.graph is not graph:
            continue
        ancestors = _ancestors(writer)
        if all(id(reader) in ancestors for reader in _readers(source)):
            safe[out_index] = in_index
    return safe
