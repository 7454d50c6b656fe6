"""Attention over a KV cache -> ``com.microsoft.GroupQueryAttention``.

Matches the ONNX ``Attention`` (opset >= 23) of a decoder layer whose keys and values are its cache after this step's
update, with or without transformers' ``repeat_kv`` expansion to the query's head count:

- a static cache: ``Transpose(ScatterND(Transpose(past), positions, new), ...)`` with ``positions =
  cumulative_length + arange(seq)`` (``StaticLayer.update``'s ``index_copy_``);
- a growing cache: ``Concat(past, new, axis=2)`` (``DynamicLayer.update``).

``GroupQueryAttention`` takes the new keys/values, writes them into the cache itself at ``total - seq`` (the same
slots) and attends over the first ``total`` positions with the graph's own mask as ``attention_bias`` (so padding and
sliding windows stay as traced), without expanding the cache to the query's heads. When the runner binds the cache
output onto its input (a static cache), the op updates the cache in place: nothing is copied.

``GroupQueryAttention`` is causal, and takes several query tokens over a non-empty cache only for a batch of one:
a graph is fused only where its batch is fixed at 1 or its query length at 1 (a single-token decode), which covers
the decode graphs of generation; other graphs keep the standard ``Attention``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ._graph import CONTRIB, Editor, as_bsd, from_bsd, int_list, like, perm, producer, replace, static_dim

__all__ = ["fuse_group_query_attention"]


def _unrepeated(value: ir.Value) -> ir.Value:
    """The cache ``repeat_kv`` expanded into ``value`` (``Reshape(Expand(Unsqueeze(cache, 2)))``), else ``value``."""
    reshape = producer(value, "Reshape")
    expand = producer(reshape.inputs[0], "Expand") if reshape is not None else None
    unsqueeze = producer(expand.inputs[0], "Unsqueeze") if expand is not None else None
    if unsqueeze is None or int_list(unsqueeze.inputs[1]) != [2]:
        return value
    return unsqueeze.inputs[0]


def _positions_offset(index: ir.Value) -> ir.Value | None:
    """``cumulative_length`` if ``index`` is ``Unsqueeze(arange(n) + cumulative_length, -1)``."""
    unsqueeze = producer(index, "Unsqueeze")
    if unsqueeze is None or int_list(unsqueeze.inputs[1]) not in ([-1], [1]):
        return None
    add = producer(unsqueeze.inputs[0], "Add")
    if add is None:
        return None
    for arange, offset in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        node = producer(arange, "Range")
        if node is not None and int_list(node.inputs[0]) == [0] and int_list(node.inputs[2]) == [1]:
            return offset
        folded = int_list(arange)  # a fixed number of new tokens: the range was folded into a constant
        if folded is not None and folded == list(range(len(folded))):
            return offset
    return None


def _static_update(full: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value, list[int]] | None:
    """``(past, offset, new, perm)`` for ``full = Transpose(ScatterND(Transpose(past), positions, Expand?(Transpose(new,
    perm))))``: ``new`` transposed by ``perm`` is the update as ``[seq, batch, heads, dim]``."""
    outer = producer(full, "Transpose")
    scatter = producer(outer.inputs[0], "ScatterND") if outer is not None and perm(outer) == [1, 2, 0, 3] else None
    reduction = scatter.attributes.get("reduction") if scatter is not None else None
    if scatter is None or (reduction is not None and reduction.value != "none"):
        return None
    inner = producer(scatter.inputs[0], "Transpose")
    if inner is None or perm(inner) != [2, 0, 1, 3]:
        return None
    offset = _positions_offset(scatter.inputs[1])
    update = scatter.inputs[2]
    expand = producer(update, "Expand")
    if expand is not None:
        update = expand.inputs[0]
    transpose = producer(update, "Transpose")
    if offset is None or transpose is None:
        return None
    return inner.inputs[0], offset, transpose.inputs[0], perm(transpose)


def _growing_update(full: ir.Value) -> tuple[ir.Value, ir.Value] | None:
    """``(past, new)`` for ``full = Concat(past, new, axis=2)``."""
    concat = producer(full, "Concat")
    if concat is None or len(concat.inputs) != 2 or concat.attributes["axis"].value not in (2, -2):
        return None
    return concat.inputs[0], concat.inputs[1]


def _new_bsd(editor: Editor, new: ir.Value, order: list[int] | None) -> ir.Value:
    """The step's new keys/values as ``[batch, seq, heads * dim]``: ``new`` is ``[batch, heads, seq, dim]`` when
    ``order`` is None, else ``Transpose(new, order)`` is ``[seq, batch, heads, dim]``."""
    if order is None:
        return as_bsd(editor, new)
    bshd = [order[1], order[0], order[2], order[3]]
    if bshd == [0, 2, 1, 3]:  # new is [batch, heads, seq, dim]
        return as_bsd(editor, new)
    if bshd != [0, 1, 2, 3]:
        new = editor.op("Transpose", [new], perm=bshd)
    return editor.op("Reshape", [new, editor.const([0, 0, -1], np.int64)])


def _same_dim(a: ir.Value, axis_a: int, b: ir.Value, axis_b: int) -> bool:
    """Whether two axes are known to have the same size (equal numbers, or the same symbol)."""
    if a.shape is None or b.shape is None or len(a.shape) <= axis_a or len(b.shape) <= axis_b:
        return False
    x, y = a.shape[axis_a], b.shape[axis_b]
    if isinstance(x, int) or isinstance(y, int):
        return static_dim(a, axis_a) is not None and static_dim(a, axis_a) == static_dim(b, axis_b)
    return x.value is not None and x.value == y.value


def _update_length(new: ir.Value, order: list[int] | None) -> tuple[ir.Value, int]:
    """The value and axis holding the number of new tokens of an update (see :func:`_new_bsd`)."""
    return (new, 2) if order is None else (new, order[0])


def _fuse(model: ir.Model, attention: ir.Node) -> bool:
    graph = model.graph
    inputs = list(attention.inputs)
    if len(inputs) < 3 or len(inputs) > 4 or any(o.uses() for o in attention.outputs[1:]):
        return False
    attrs = {k: a.value for k, a in attention.attributes.items()}
    if attrs.get("qk_matmul_output_mode", 0) or attrs.get("is_causal", 0):
        return False
    query, keys, values = inputs[:3]
    mask = inputs[3] if len(inputs) == 4 else None
    heads, dim, batch, seq = (static_dim(query, a) for a in (1, 3, 0, 2))
    if heads is None or dim is None or not (batch == 1 or seq == 1):
        return False
    # GroupQueryAttention is causal: without a mask (which carries the graph's own causality) only one query token
    # is the same computation; its attention_bias is 4D
    if (mask is None and seq != 1) or (mask is not None and (mask.shape is None or len(mask.shape) != 4)):
        return False
    full_keys, full_values = _unrepeated(keys), _unrepeated(values)
    kv_heads = static_dim(full_keys, 1)
    if kv_heads is None or heads % kv_heads or static_dim(full_values, 1) != kv_heads:
        return False
    editor = Editor(graph)
    static_k, static_v = _static_update(full_keys), _static_update(full_values)
    if static_k is not None and static_v is not None and static_k[1] is static_v[1]:
        # self-attention over this step's tokens only: a cross-attention cache filled from the encoder has as many
        # new tokens as the encoder, not as the query
        if not all(_same_dim(*_update_length(u[2], u[3]), query, 2) for u in (static_k, static_v)):
            return False
        past_k, past_v, offset = static_k[0], static_v[0], static_k[1]
        new_k = _new_bsd(editor, static_k[2], static_k[3])
        new_v = _new_bsd(editor, static_v[2], static_v[3])
    else:
        grow_k, grow_v = _growing_update(full_keys), _growing_update(full_values)
        if grow_k is None or grow_v is None or not all(_same_dim(g[1], 2, query, 2) for g in (grow_k, grow_v)):
            return False
        past_k, past_v, offset = grow_k[0], grow_v[0], None
        new_k, new_v = as_bsd(editor, grow_k[1]), as_bsd(editor, grow_v[1])
    query_bsd = as_bsd(editor, query)
    seq_1d = editor.op("Shape", [query_bsd], start=1, end=2)
    if offset is not None:
        past_len = editor.op("Reshape", [offset, editor.const([1], np.int64)])
    else:
        past_len = editor.op("Shape", [past_k], start=2, end=3)
    total = editor.op("Add", [past_len, seq_1d])
    last = editor.op("Cast", [editor.op("Sub", [total, editor.const([1], np.int64)])], to=ir.DataType.INT32)
    seqlens = editor.op("Expand", [last, editor.op("Shape", [query_bsd], start=0, end=1)])
    total_i32 = editor.op("Cast", [total], to=ir.DataType.INT32)
    bias = None
    if mask is not None:
        bias = mask
        if mask.dtype == ir.DataType.BOOL:
            dtype = query.dtype.numpy() if query.dtype is not None else np.float32
            bias = editor.op("Where", [mask, editor.const(np.array(0, dtype)), editor.const(np.array(-np.inf, dtype))])
        bias = editor.op("Slice", [bias, editor.const([0], np.int64), total, editor.const([3], np.int64)])
    scale = attrs.get("scale")
    softcap = attrs.get("softcap") or None
    output, present_k, present_v = editor.op(
        "GroupQueryAttention",
        [query_bsd, new_k, new_v, past_k, past_v, seqlens, total_i32, None, None, None, bias],
        domain=CONTRIB,
        outputs=3,
        num_heads=heads,
        kv_num_heads=kv_heads,
        scale=float(scale) if scale is not None else None,
        softcap=float(softcap) if softcap else None,
    )
    output.type, output.shape = query.type, query_bsd.shape  # [batch, seq, heads * dim], as the query
    like(present_k, full_keys)
    like(present_v, full_values)
    result = like(from_bsd(editor, output, heads, dim), attention.outputs[0])
    editor.commit(attention)
    replace(attention.outputs[0], result)
    replace(full_keys, present_k)
    replace(full_values, present_v)
    return True


def fuse_group_query_attention(model: ir.Model) -> int:
    """Replace every matched attention over a cache; returns how many."""
    attentions = [n for n in model.graph if n.op_type == "Attention" and n.domain in ("", "ai.onnx")]
    count = sum(_fuse(model, node) for node in attentions)
    if count:
        model.opset_imports.setdefault(CONTRIB, 1)
        model.graph.sort()
    return count
