"""Rotary position embeddings -> ``com.microsoft.RotaryEmbedding``.

Matches transformers' ``x * cos + rotate_half(x) * sin`` on a ``[batch, heads, seq, dim]`` tensor, where ``cos`` /
``sin`` are ``Cos`` / ``Sin`` of ``Concat(freqs, freqs)`` (optionally scaled and cast) unsqueezed on the head axis,
and ``rotate_half`` is ``Concat(-x[..., d/2:], x[..., :d/2])``. The fused op reads its angles from a cache indexed by
position: the cache here is built from the graph's own ``freqs`` (``[batch, seq, d/2]`` flattened to rows) and the
positions are the row numbers, so no maximum length is baked in and every batch row keeps its own positions.
The fused op runs on ``[batch, seq, heads * dim]``: the heads are transposed back only where a consumer still needs
``[batch, heads, seq, dim]`` (the attention fusion then takes the fused output as is).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from ._graph import CONTRIB, Editor, as_bsd, from_bsd, int_list, like, producer, replace, static_dim

__all__ = ["fuse_rotary_embeddings"]

_BIG = 2**62


def _half_slice(value: ir.Value, x: ir.Value, start: int, end_min: int, end_max: int | None) -> bool:
    node = producer(value, "Slice")
    if node is None or node.inputs[0] is not x or len(node.inputs) < 4:
        return False
    starts, ends, axes = (int_list(node.inputs[i]) for i in (1, 2, 3))
    steps = int_list(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else [1]
    if starts != [start] or axes not in ([3], [-1]) or steps != [1] or ends is None or len(ends) != 1:
        return False
    return ends[0] >= end_min if end_max is None else ends[0] == end_max


def _rotate_half_of(value: ir.Value, dim: int) -> ir.Value | None:
    """``x`` if ``value`` is ``rotate_half(x)``."""
    concat = producer(value, "Concat")
    if concat is None or len(concat.inputs) != 2 or concat.attributes.get("axis").value not in (3, -1):
        return None
    neg = producer(concat.inputs[0], "Neg")
    if neg is None:
        return None
    second = producer(neg.inputs[0], "Slice")
    x = second.inputs[0] if second is not None else None
    half = dim // 2
    if x is None or not _half_slice(neg.inputs[0], x, half, dim, None):
        return None
    if not _half_slice(concat.inputs[1], x, 0, 0, half):
        return None
    return x


def _angles(value: ir.Value, function: str) -> tuple[ir.Value, list] | None:
    """``(freqs, post)`` if ``value`` is ``Unsqueeze(post(function(Concat(freqs, freqs))), [1])``; ``post`` lists the
    scaling ``Mul``s and ``Cast``s between, to replay on the cache."""
    unsqueeze = producer(value, "Unsqueeze")
    if unsqueeze is None or int_list(unsqueeze.inputs[1]) != [1]:
        return None
    post: list[ir.Node] = []
    current = unsqueeze.inputs[0]
    while True:
        node = current.producer() if current is not None else None
        if node is None:
            return None
        scalar = node.op_type == "Mul" and node.inputs[1] is not None and node.inputs[1].const_value is not None
        if node.op_type == "Cast" or (scalar and node.inputs[1].const_value.size == 1):
            post.insert(0, node)
            current = node.inputs[0]
            continue
        break
    trig = producer(current, function)
    concat = producer(trig.inputs[0], "Concat") if trig is not None else None
    if concat is None or len(concat.inputs) != 2 or concat.inputs[0] is not concat.inputs[1]:
        return None
    return concat.inputs[0], post


def _match(add: ir.Node) -> tuple | None:
    for mul_x, mul_r in ((add.inputs[0], add.inputs[1]), (add.inputs[1], add.inputs[0])):
        px, pr = producer(mul_x, "Mul"), producer(mul_r, "Mul")
        if px is None or pr is None:
            continue
        for rotated, sin4 in ((pr.inputs[0], pr.inputs[1]), (pr.inputs[1], pr.inputs[0])):
            for x, cos4 in ((px.inputs[0], px.inputs[1]), (px.inputs[1], px.inputs[0])):
                heads, dim = static_dim(x, 1), static_dim(x, 3)
                if heads is None or dim is None or dim % 2 or x.shape is None or len(x.shape) != 4:
                    continue
                if _rotate_half_of(rotated, dim) is not x:
                    continue
                cos, sin = _angles(cos4, "Cos"), _angles(sin4, "Sin")
                if cos is None or sin is None or cos[0] is not sin[0]:
                    continue
                return x, cos[0], cos[1], sin[1], heads, dim
    return None


def _replay(editor: Editor, value: ir.Value, nodes: list[ir.Node]) -> ir.Value:
    for node in nodes:
        attrs = {k: a.value for k, a in node.attributes.items()}
        value = editor.op(node.op_type, [value, *node.inputs[1:]], **attrs)
    return value


def fuse_rotary_embeddings(model: ir.Model) -> int:
    """Replace every matched rotary embedding; returns how many."""
    graph = model.graph
    caches: dict[tuple, tuple] = {}
    count = 0
    for add in [n for n in graph if n.op_type == "Add" and n.domain in ("", "ai.onnx")]:
        match = _match(add)
        if match is None:
            continue
        x, freqs, cos_post, sin_post, heads, dim = match
        editor = Editor(graph)
        key = (id(freqs), tuple(id(n) for n in cos_post), tuple(id(n) for n in sin_post))
        x_bsd = as_bsd(editor, x)
        if key not in caches:
            rows = editor.op("Shape", [freqs], start=0, end=2)
            count_rows = editor.op("ReduceProd", [rows], keepdims=0)
            positions = editor.op("Range", [editor.const(0, np.int64), count_rows, editor.const(1, np.int64)])
            positions = editor.op("Reshape", [positions, rows])
            # angles computed once for a batch of one (positions from arange) serve every row of the batch
            positions = editor.op("Expand", [positions, editor.op("Shape", [x_bsd], start=0, end=2)])
            flat = editor.op("Reshape", [freqs, editor.const([-1, dim // 2], np.int64)])
            cos_cache = _replay(editor, editor.op("Cos", [flat]), cos_post)
            sin_cache = _replay(editor, editor.op("Sin", [flat]), sin_post)
            caches[key] = (positions, cos_cache, sin_cache)
        positions, cos_cache, sin_cache = caches[key]
        rotated = editor.op(
            "RotaryEmbedding", [x_bsd, positions, cos_cache, sin_cache], domain=CONTRIB, interleaved=0, num_heads=heads
        )
        rotated.type, rotated.shape = x.type, x_bsd.shape  # shape-preserving: lets collapse_reshapes see the rank
        result = like(from_bsd(editor, rotated, heads, dim), add.outputs[0])
        editor.commit(add)
        replace(add.outputs[0], result)
        count += 1
    if count:
        model.opset_imports.setdefault(CONTRIB, 1)
    return count
