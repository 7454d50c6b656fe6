"""Small helpers to read and edit ``onnx_ir`` graphs, shared by the fusion passes."""

from __future__ import annotations

import itertools

import numpy as np
import onnx_ir as ir

__all__ = ["CONTRIB", "Editor", "as_bsd", "from_bsd", "int_list", "like", "perm", "producer", "replace", "static_dim"]

CONTRIB = "com.microsoft"
_counter = itertools.count()


def producer(value: ir.Value | None, op_type: str, domain: str = "") -> ir.Node | None:
    """The node that computes ``value``, if it is an ``op_type`` node of ``domain``."""
    node = value.producer() if value is not None else None
    domains = (domain,) if domain else ("", "ai.onnx")
    if node is None or node.op_type != op_type or (node.domain or "") not in domains:
        return None
    return node


def perm(node: ir.Node) -> list[int]:
    attr = node.attributes.get("perm")
    return [int(p) for p in attr.value] if attr is not None else []


def int_list(value: ir.Value | None) -> list[int] | None:
    """The integers of a constant ``value`` (initializer or folded), else ``None``."""
    if value is None or value.const_value is None:
        return None
    array = value.const_value.numpy()
    if array.dtype.kind not in "iu":
        return None
    return [int(x) for x in array.reshape(-1)]


def static_dim(value: ir.Value | None, axis: int) -> int | None:
    """``value``'s size along ``axis`` when known; a numeric symbol (``"16"``) counts as known."""
    if value is None or value.shape is None or not -len(value.shape) <= axis < len(value.shape):
        return None
    dim = value.shape[axis]
    if isinstance(dim, int):
        return dim
    name = getattr(dim, "value", None)
    return int(name) if isinstance(name, str) and name.isdigit() else None


class Editor:
    """Builds nodes and constants for one rewrite, then inserts them before an anchor node."""

    def __init__(self, graph: ir.Graph):
        self.graph = graph
        self.nodes: list[ir.Node] = []

    def op(self, op_type: str, inputs: list, *, domain: str = "", outputs: int = 1, **attributes) -> ir.Value | tuple:
        attrs = {k: v for k, v in attributes.items() if v is not None}
        node = ir.node(op_type, inputs, attributes=attrs, domain=domain, num_outputs=outputs)
        self.nodes.append(node)
        return node.outputs[0] if outputs == 1 else tuple(node.outputs)

    def const(self, array, dtype=None) -> ir.Value:
        array = np.asarray(array, dtype=dtype)
        name = f"hfexport_fused_const_{next(_counter)}"
        value = ir.Value(name=name, const_value=ir.tensor(array, name=name))
        value.dtype, value.shape = ir.DataType.from_numpy(array.dtype), ir.Shape(array.shape)
        self.graph.register_initializer(value)
        return value

    def commit(self, anchor: ir.Node) -> None:
        self.graph.insert_before(anchor, self.nodes)
        self.nodes = []


def like(new: ir.Value, old: ir.Value) -> ir.Value:
    """Give ``new`` the type and shape ``old`` has (for the value it replaces)."""
    new.type, new.shape = old.type, old.shape
    return new


def replace(old: ir.Value, new: ir.Value) -> None:
    """Every use of ``old``, graph outputs included, now reads ``new``."""
    old.replace_all_uses_with(new, replace_graph_outputs=True)


def as_bsd(editor: Editor, x4: ir.Value) -> ir.Value:
    """A ``[batch, seq, heads * dim]`` view of ``x4``, a ``[batch, heads, seq, dim]`` tensor, reusing the graph's own
    values where ``x4`` was made from one (``Transpose(Reshape(x, [.., heads, dim]))``)."""
    transpose = producer(x4, "Transpose")
    if transpose is not None and perm(transpose) == [0, 2, 1, 3]:
        y = transpose.inputs[0]
        reshape = producer(y, "Reshape")
        if reshape is not None and reshape.inputs[0].shape is not None and len(reshape.inputs[0].shape) == 3:
            source = reshape.inputs[0]
            if static_dim(source, 2) is not None and static_dim(source, 2) == _heads_times_dim(x4):
                return source
        return editor.op("Reshape", [y, editor.const([0, 0, -1], np.int64)])
    swapped = editor.op("Transpose", [x4], perm=[0, 2, 1, 3])
    return editor.op("Reshape", [swapped, editor.const([0, 0, -1], np.int64)])


def _heads_times_dim(x4: ir.Value) -> int | None:
    heads, dim = static_dim(x4, 1), static_dim(x4, 3)
    return heads * dim if heads is not None and dim is not None else None


def from_bsd(editor: Editor, x_bsd: ir.Value, heads: int, dim: int) -> ir.Value:
    """``[batch, heads, seq, dim]`` from ``[batch, seq, heads * dim]``."""
    split = editor.op("Reshape", [x_bsd, editor.const([0, 0, heads, dim], np.int64)])
    return editor.op("Transpose", [split], perm=[0, 2, 1, 3])
