"""OpenVINO: sizes made floats (``torch.sym_float``, a ``/`` of sizes) computed as 0-d float32 tensors.

The PyTorch frontend converts the integer arithmetic of symbolic sizes but has no rule for a size made a float:
"No conversion rule found for operations: <built-in function truediv>, <function sym_float>" (openvino 2026.3.1).
Music Flamingo divides its audio timestamps by a window duration ``0.04 * seq_len``; the SAM-style relative
positions of DeepSeek-OCR 2's vision encoder scale ``arange(q_size)`` by ``max(k_size / q_size, 1.0)``. Before
conversion each such float becomes a 0-d float32 tensor (``aten.scalar_tensor`` of the size), and the Python
arithmetic that consumes it, recursively (``*``, ``+``, ``-``, ``/``, ``max``, ``min`` with numbers, sizes or other
such floats), the matching ``aten`` ops on tensors, so the tensor ops that read the float read a tensor. A float
some other Python function reads is left (its conversion fails as before). Drop it once the frontend converts
symbolic floats.
"""

from __future__ import annotations

import operator
from typing import Any

import torch

from ..capture.graph_passes import call_with_value, rewrite_nodes, traced
from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["float_sizes_as_tensors"]

_aten = torch.ops.aten
_ARITHMETIC = (operator.mul, operator.add, operator.sub, operator.truediv, torch.sym_max, torch.sym_min,
               operator.neg)


def float_sizes_as_tensors(program: Any) -> int:
    """Rewrite each size made a float in ``program`` (and the arithmetic on it) as 0-d float32 tensors; returns how
    many roots it rewrote."""
    return rewrite_nodes(program, _root)


def _is_float(value: Any) -> bool:
    return isinstance(value, (float, torch.SymFloat))


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool)


def _root(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    if getattr(node, "_erased", False) or not _is_float(node.meta.get("val")):
        return False
    if node.target is torch.sym_float and len(node.args) == 1 and _is_int(traced(node.args[0])):
        with graph.inserting_before(node):
            tensor = _scalar(graph, node.args[0])
    elif node.target is operator.truediv and len(node.args) == 2 and all(_is_int(traced(a)) for a in node.args):
        with graph.inserting_before(node):
            sizes = [_scalar(graph, a) if isinstance(a, torch.fx.Node) else a for a in node.args]
            if not _tensor(sizes[0]):  # (a constant over a size)
                sizes[0] = _scalar(graph, sizes[0])
            tensor = _apply_op(graph, operator.truediv, sizes)
    else:
        return False
    _replace(graph, node, tensor)
    return True


def _scalar(graph: torch.fx.Graph, size: Any) -> torch.fx.Node:
    return call_with_value(graph, _aten.scalar_tensor.default, (size,), torch.empty((), dtype=torch.float32),
                           {"dtype": torch.float32})


def _replace(graph: torch.fx.Graph, node: torch.fx.Node, tensor: torch.fx.Node) -> None:
    """Put ``tensor`` in ``node``'s place, then rewrite each user that is Python arithmetic on it likewise."""
    node.replace_all_uses_with(tensor)
    graph.erase_node(node)
    for user in list(tensor.users):
        if user.target not in _ARITHMETIC or user.kwargs:
            continue
        operands = [a if a is tensor or not isinstance(a, torch.fx.Node) or not _is_int(traced(a)) else None
                    for a in user.args]
        with graph.inserting_before(user):
            operands = [_scalar(graph, a) if o is None else o for a, o in zip(user.args, operands, strict=True)]
            new = _apply_op(graph, user.target, operands)
        if new is not None:
            _replace(graph, user, new)


def _tensor(value: Any) -> bool:
    return isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), torch.Tensor)


def _apply_op(graph: torch.fx.Graph, target: Any, operands: list[Any]) -> torch.fx.Node | None:
    """``target(*operands)`` as an ``aten`` op on a 0-d float32 tensor (at least one operand is one; the others
    0-d tensors or numbers), or ``None`` where an operand is neither."""
    if not all(_tensor(o) or isinstance(o, (int, float)) for o in operands):
        return None
    scalar = torch.empty((), dtype=torch.float32)

    def call(op: Any, *args: Any) -> torch.fx.Node:
        return call_with_value(graph, op, args, scalar)

    if target is operator.neg:
        return call(_aten.neg.default, operands[0])
    a, b = operands
    if not _tensor(a) and target in (operator.mul, operator.add, torch.sym_max, torch.sym_min):
        a, b = b, a  # (commutative: the tensor first)
    if target is operator.mul:
        return call(_aten.mul.Tensor, a, b)
    if target is operator.add:
        return call(_aten.add.Tensor, a, b)
    if target is operator.sub:
        return call(_aten.sub.Tensor, a, b) if _tensor(a) else call(_aten.rsub.Scalar, b, a)
    if target is operator.truediv:
        if _tensor(a):
            return call(_aten.div.Tensor, a, b)
        return call(_aten.mul.Tensor, call(_aten.reciprocal.default, b), a)
    if target is torch.sym_max:
        return call(_aten.maximum.default, a, b) if _tensor(b) else call(_aten.clamp_min.default, a, b)
    return call(_aten.minimum.default, a, b) if _tensor(b) else call(_aten.clamp_max.default, a, b)


@workaround(
    id="openvino-symbolic-floats",
    backend="openvino",
    target="openvino.convert_model (torch.sym_float, operator.truediv of sizes in an ExportedProgram)",
    breaks="a graph that makes a size a float does not convert: 'No conversion rule found for operations: <built-in "
    "function truediv>, <function sym_float>' (Music Flamingo's window duration, DeepSeek-OCR 2's relative "
    "positions)",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_program_before_convert(float_sizes_as_tensors)
