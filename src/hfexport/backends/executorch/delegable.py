"""Rewrite two ops of a traced program that XNNPACK refuses into matmuls it takes, so each layer lowers whole.

XNNPACK's partitioner leaves outside its delegates (executorch 1.5.1,
``executorch/backends/xnnpack/partition/config/generic_node_configs.py``):

- a ``slice_copy`` whose input or output has a dynamic dim (``SliceCopyConfig``): transformers' ``rotate_half``,
  ``cat((-x[..., h:], x[..., :h]), -1)``, on queries and keys whose sequence length is dynamic;
- a ``mean.dim`` other than a 4-D mean over dims 2 and 3 (``MeanDimConfig``): every RMSNorm's
  ``x.pow(2).mean(-1, keepdim=True)``;
- a ``view_copy`` whose shape has a symbolic entry (``ViewCopyConfig``): the attention's
  ``view(batch, seq_len, -1, head_dim)``, where only one dim is dynamic and the ``-1`` could say it;
- ``alias_copy`` (no config at all): the identity transformers' ``logits_to_keep`` slicing traces to.

Each op left outside cuts the graph around it, so a SmolLM2 layer became about five delegates (153 for 30 layers)
where only the attention's custom op must stand apart. Every delegate costs export time (XNNPACK's passes run per
partition, and ExecuTorch legalises the whole graph once per delegate: ``create_submodule_from_nodes``,
executorch/exir/lowered_backend_module.py) and a call at run time. No ExecuTorch pass does this; it is ours.

Each rewrite is exact or within an ulp (a view's shape and an alias's removal change no value):

- ``rotate_half(x)`` becomes ``linear(x, P)`` with ``P`` the signed permutation ``P[j, j + h] = -1`` (``j < h``),
  ``P[j, j - h] = 1``: each output is one input times +-1 plus zeros, the same bits as the slices.
- ``y.mean(-1, keepdim=True)`` becomes ``linear(y, ones(1, n)) / n``: the sum in another order, then the same
  division as ATen's mean.

The constants are tiny (``2h x 2h`` and ``1 x n``), named by their content so the programs of one export share them.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.export.graph_signature import InputKind, InputSpec, TensorArgument

__all__ = ["make_delegable", "signed_half_rotation"]

logger = logging.getLogger(__name__)

_aten = torch.ops.aten
_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)


def signed_half_rotation(size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ``[size, size]`` weight ``P`` with ``linear(x, P) == cat((-x[..., h:], x[..., :h]), -1)``, ``h = size/2``."""
    half = size // 2
    weight = torch.zeros(size, size, dtype=dtype)
    rows = torch.arange(half)
    weight[rows, rows + half] = -1
    weight[rows + half, rows] = 1
    return weight


def make_delegable(program: torch.export.ExportedProgram) -> dict[str, int]:
    """Rewrite ``program``'s ``rotate_half`` and last-dim means as matmuls, its symbolic views with ``-1``, and drop
    its aliases of computed tensors, in place; return how many of each."""
    graph = program.graph_module.graph
    counts = {"rotate_half": 0, "mean": 0, "view": 0, "alias": 0}
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is _aten.cat.default:
            source = _rotated_half_of(node)
            if source is not None:
                size = source.meta["val"].shape[-1]
                weight = _constant(program, signed_half_rotation(size, source.meta["val"].dtype),
                                   f"hfexport_rotate_half_{size}")
                neg, first = node.args[0]
                _replace(node, _aten.linear.default, (source, weight))
                _erase_unused(neg, neg.args[0], first)
                counts["rotate_half"] += 1
        elif node.target is _aten.mean.dim and _last_dim_mean(node):
            source = node.args[0]
            size = source.meta["val"].shape[-1]
            ones = _constant(program, torch.ones(1, size, dtype=source.meta["val"].dtype), f"hfexport_ones_{size}")
            with graph.inserting_before(node):
                total = graph.call_function(_aten.linear.default, (source, ones))
                total.meta = {**node.meta, "val": _fake(_aten.linear.default, source, ones)}
            _replace(node, _aten.div.Tensor, (total, size))
            counts["mean"] += 1
        elif node.target in _VIEWS and (shape := _static_view_shape(node)) is not None:
            node.args = (node.args[0], shape, *node.args[2:])
            counts["view"] += 1
        elif (node.target is _aten.alias.default and isinstance(node.args[0], torch.fx.Node)
              and node.args[0].op == "call_function"):  # (an alias of an input stays: no output may be an input)
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            counts["alias"] += 1
    _erase_unused(*(n for n in graph.nodes if n.target is _aten.sym_size.int))  # a view's size read, now unread
    program.graph_module.recompile()
    if any(counts.values()):
        logger.info("XNNPACK-delegable rewrites: %s", counts)
    return counts


def _rotated_half_of(cat: torch.fx.Node) -> torch.fx.Node | None:
    """``x`` where ``cat`` is ``cat((neg(x[..., h:]), x[..., :h]), -1)`` over a float ``x`` of static last dim ``2h``."""
    parts = cat.args[0]
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if len(parts) != 2 or not all(isinstance(p, torch.fx.Node) for p in parts):
        return None
    neg, first = parts
    if neg.target is not _aten.neg.default or not isinstance(neg.args[0], torch.fx.Node):
        return None
    second = neg.args[0]
    value = second.args[0].meta.get("val") if _is_slice(second) else None
    if value is None or value.dtype not in _FLOATS or not isinstance(value.shape[-1], int):
        return None
    rank, size = value.dim(), value.shape[-1]
    if dim not in (-1, rank - 1) or size % 2 or not _is_slice(first) or first.args[0] is not second.args[0]:
        return None
    half = size // 2
    if _slice_bounds(second, rank, size) != (half, size) or _slice_bounds(first, rank, size) != (0, half):
        return None
    return second.args[0]


def _is_slice(node: Any) -> bool:
    return isinstance(node, torch.fx.Node) and node.target is _aten.slice.Tensor and isinstance(node.args[0], torch.fx.Node)


def _slice_bounds(node: torch.fx.Node, rank: int, size: int) -> tuple[int, int] | None:
    """``(start, end)`` of a step-1 slice of the last dim, clamped to ``size``; None for anything else."""
    args = list(node.args) + [None] * (5 - len(node.args))
    dim, start, end, step = args[1] if args[1] is not None else 0, args[2], args[3], args[4]
    if dim not in (-1, rank - 1) or step not in (None, 1):
        return None
    start = 0 if start is None else start
    end = size if end is None else end
    if not isinstance(start, int) or not isinstance(end, int):
        return None
    return max(0, min(start, size)), max(0, min(end, size))


def _last_dim_mean(node: torch.fx.Node) -> bool:
    """Whether ``node`` is ``mean(y, [-1], keepdim=True)`` over a float ``y`` of static last dim, no dtype."""
    source = node.args[0]
    value = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if value is None or value.dtype not in _FLOATS or not isinstance(value.shape[-1], int) or value.dim() < 2:
        return False
    dims = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
    if node.kwargs.get("dtype") is not None or not keepdim or not isinstance(dims, (list, tuple)) or len(dims) != 1:
        return False
    return dims[0] in (-1, value.dim() - 1)


def _static_view_shape(node: torch.fx.Node) -> list[int] | None:
    """The shape of a view whose target shape has a symbolic entry, as ints with ``-1`` at its one dynamic dim (what
    XNNPACK's static reshape takes); None where the view is already static or has more than one dynamic dim."""
    shape, value = node.args[1], node.meta.get("val")
    if not isinstance(shape, (list, tuple)) or all(isinstance(d, int) for d in shape) or value is None:
        return None
    dynamic = [i for i, d in enumerate(value.shape) if not isinstance(d, int)]
    if len(dynamic) != 1 or len(shape) != value.dim():
        return None
    return [-1 if i == dynamic[0] else d for i, d in enumerate(value.shape)]


def _erase_unused(*nodes: torch.fx.Node) -> None:
    """Erase each of ``nodes`` (in order) that nothing reads any more."""
    for node in nodes:
        if not node.users:
            node.graph.erase_node(node)


def _fake(op: Any, *args: Any) -> Any:
    values = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
    mode = next(v.fake_mode for v in values if hasattr(v, "fake_mode"))
    with mode:
        return op(*values)


def _replace(node: torch.fx.Node, op: Any, args: tuple) -> torch.fx.Node:
    graph = node.graph
    with graph.inserting_before(node):
        new = graph.call_function(op, args)
    new.meta = {**node.meta, "val": _fake(op, *args)}
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    return new


def _constant(program: torch.export.ExportedProgram, tensor: torch.Tensor, name: str) -> torch.fx.Node:
    """A new placeholder of a program constant holding ``tensor``, before the user inputs, for one use.

    One per use: a constant used in two partitions is duplicated by ExecuTorch (``duplicate_constant_node``,
    executorch/exir/backend/canonical_partitioners/duplicate_constant_node_pass.py), and the copies keep the
    original's target, so a delegate holding two of them cannot be unlifted ("... is not a buffer"). The copies
    cost nothing stored: ExecuTorch's named data keeps one buffer per content.
    """
    graph = program.graph_module.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    taken = set(program.constants) | {n.name for n in placeholders}
    name = f"{name}_{str(tensor.dtype).removeprefix('torch.')}"
    name = next(f"{name}_{i}" for i in range(len(taken) + 1) if f"{name}_{i}" not in taken)
    specs = program.graph_signature.input_specs
    first_user = next((i for i, s in enumerate(specs) if s.kind == InputKind.USER_INPUT), len(specs))
    anchor = placeholders[first_user] if first_user < len(placeholders) else next(
        n for n in graph.nodes if n.op != "placeholder")
    with graph.inserting_before(anchor):
        node = graph.placeholder(name)
    name = node.target = node.name
    mode = next(n.meta["val"].fake_mode for n in placeholders if hasattr(n.meta.get("val"), "fake_mode"))
    node.meta["val"] = mode.from_tensor(tensor, static_shapes=True)
    program.constants[name] = tensor
    specs.insert(first_user, InputSpec(InputKind.CONSTANT_TENSOR, TensorArgument(name=name), target=name))
    return node
