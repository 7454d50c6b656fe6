"""Back-to-back ``Reshape``s the fusions leave behind collapse into one, and a ``Reshape`` that keeps its input's shape
goes.

The contrib ops take ``[batch, seq, heads * dim]`` where the traced graph has ``[batch, seq, heads, dim]``: around
every ``RotaryEmbedding`` and ``GroupQueryAttention`` the fusions split the last axis and merge it back
(``Reshape(Reshape(x, [0, 0, h, d]), [0, 0, -1])``), which is ``x`` itself. Each is a node ONNX Runtime schedules at
every decode step (8 per decoder layer before this pass), and neither ONNX Runtime's optimiser nor onnxscript's
removes them.

Rules:

- ``Reshape(Reshape(x, a), b)`` -> ``Reshape(x, b)`` (the data is the same, in the same order) when the outer node
  has ``allowzero=1`` (as torch's exporter writes them: every entry of ``b`` is a size), or when no entry of ``b`` can
  copy a dimension that differs between ``x`` and ``Reshape(x, a)``: each entry of ``b`` is a known non-zero constant,
  or sits where ``a`` copies ``x``'s dimension (0, without ``allowzero``) or where both shapes carry the same number
  or symbol. ``b`` is a constant, or a ``Concat`` of one-element pieces.
- ``Reshape(x, b)`` -> ``x`` when ``b`` is a constant that gives ``x``'s own shape: every entry 0 (a copy, without
  ``allowzero``) or equal to ``x``'s known dimension, except at most one -1 standing for the one dimension left.
"""

from __future__ import annotations

import onnx_ir as ir

from ._graph import int_list, producer, replace, static_dim

__all__ = ["collapse_reshapes"]


def _allowzero(node: ir.Node) -> bool:
    attr = node.attributes.get("allowzero")
    return attr is not None and bool(attr.value)


def _entries(shape: ir.Value) -> list[int | None] | None:
    """The entries of a 1-D shape value, ``None`` where an entry is computed at run time."""
    known = int_list(shape)
    if known is not None:
        return known
    concat = producer(shape, "Concat")
    if concat is None:
        return None
    entries: list[int | None] = []
    for piece in concat.inputs:
        if piece is None or piece.shape is None or len(piece.shape) != 1 or static_dim(piece, 0) != 1:
            return None
        values = int_list(piece)
        entries.append(values[0] if values is not None else None)
    return entries


def _same_axis(a: ir.Value, b: ir.Value, axis: int) -> bool:
    """Whether ``a`` and ``b`` are known to have the same size along ``axis`` (equal numbers or one named symbol)."""
    if a.shape is None or b.shape is None or axis >= min(len(a.shape), len(b.shape)):
        return False
    x, y = a.shape[axis], b.shape[axis]
    if isinstance(x, int) or isinstance(y, int):
        return static_dim(a, axis) is not None and static_dim(a, axis) == static_dim(b, axis)
    return x.value is not None and x.value == y.value


def _merge(node: ir.Node) -> bool:
    inner = producer(node.inputs[0], "Reshape")
    if inner is None:
        return False
    x, middle = inner.inputs[0], inner.outputs[0]
    if not _allowzero(node):  # with allowzero every entry is a size, whatever the input's shape: always safe
        first, second = int_list(inner.inputs[1]), _entries(node.inputs[1])
        if second is None:
            return False
        copies = [] if first is None or _allowzero(inner) else [i for i, v in enumerate(first) if v == 0]
        for i, entry in enumerate(second):
            if entry is not None and entry != 0:
                continue
            # a 0 (or an entry known only at run time) here must read a dimension x and the intermediate share
            if i not in copies and not _same_axis(x, middle, i):
                return False
    node.replace_input_with(0, x)
    return True


def _keeps_shape(node: ir.Node) -> bool:
    x, target = node.inputs[0], int_list(node.inputs[1])
    if target is None or x.shape is None or len(x.shape) != len(target):
        return False
    unknown = 0
    for axis, entry in enumerate(target):
        if entry == 0 and not _allowzero(node):
            continue
        if entry == -1:
            unknown += 1
            continue
        if static_dim(x, axis) != entry:
            return False
    # a single -1 stands for what is left: the dimension at its own axis, since every other axis keeps its size
    return unknown <= 1


def collapse_reshapes(model: ir.Model) -> int:
    """Apply both rules over the graph; returns how many ``Reshape`` inputs were rewired or nodes bypassed."""
    count = 0
    for node in [n for n in model.graph if n.op_type == "Reshape" and n.domain in ("", "ai.onnx")]:
        if node.inputs[0] is None or node.inputs[1] is None:
            continue
        if _merge(node):
            count += 1
        if _keeps_shape(node) and not node.outputs[0].is_graph_output():
            replace(node.outputs[0], node.inputs[0])
            count += 1
    return count
