"""OpenVINO: a floor or truncating division of integer tensors, made an exact division.

The PyTorch frontend converts ``aten.floor_divide`` (and ``aten.div`` with ``rounding_mode="floor"`` or
``"trunc"``) of integer tensors as an integer ``Divide`` (then ``Floor``), and the CPU plugin does not give the
integer quotient: after a ``ReduceSum`` it rounds to nearest, ``(sum(mask) + 7) // 8`` of a mask of 16 ones gave 3,
not 2, and without one it truncates, ``(-5) // 8`` gave 0, not -1 (openvino 2026.3.1, measured here; the plugin's
eltwise code was not read). A length computed so is off by one: Nemotron 3.5 Transcribe's and Music Flamingo's
audio features of a padded clip keep one frame too many (7 where eager keeps 6), and the prompt's audio tokens no
longer match. ``FloorMod`` and ``Mod`` are right, so before conversion ``a // b`` becomes
``(a - remainder(a, b)) / b`` and a truncating one ``(a - fmod(a, b)) / b``: a numerator that ``b`` divides, whose
quotient the plugin gets right however it rounds. Drop it once the CPU plugin divides integers exactly.
"""

from __future__ import annotations

from typing import Any

import torch

from ..capture.graph_passes import call_with_value, rewrite_nodes, traced
from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["exact_integer_divisions"]

_aten = torch.ops.aten
_FLOOR = frozenset((_aten.floor_divide.default, _aten.floor_divide.Scalar))
_MODES = frozenset((_aten.div.Tensor_mode, _aten.div.Scalar_mode))


def exact_integer_divisions(program: Any) -> int:
    """Rewrite each floor or truncating division of integer tensors in ``program`` as an exact division; returns
    how many."""
    return rewrite_nodes(program, _exact)


def _mode(node: torch.fx.Node) -> str | None:
    if node.target in _FLOOR:
        return "floor"
    if node.target in _MODES:
        mode = node.kwargs.get("rounding_mode", node.args[2] if len(node.args) > 2 else None)
        return mode if mode in ("floor", "trunc") else None
    return None


def _exact(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    mode = _mode(node)
    if mode is None or len(node.args) < 2:
        return False
    a, b = node.args[:2]
    value, divisor = traced(a), traced(b)
    if not isinstance(value, torch.Tensor) or value.dtype.is_floating_point or value.dtype == torch.bool \
            or isinstance(divisor, float) or (isinstance(divisor, torch.Tensor) and divisor.dtype.is_floating_point):
        return False
    scalar = not isinstance(b, torch.fx.Node)
    if mode == "floor":
        rest = _aten.remainder.Scalar if scalar else _aten.remainder.Tensor
    else:
        rest = _aten.fmod.Scalar if scalar else _aten.fmod.Tensor
    # (each new node's value is the division's own: same broadcast shape and integer dtype; no op is run on the
    # traced values, which may belong to a mode that is not active here)
    out = node.meta.get("val")
    with graph.inserting_before(node):
        remainder = call_with_value(graph, rest, (a, b), out)
        numerator = call_with_value(graph, _aten.sub.Tensor, (a, remainder), out)
        # (Tensor_mode for a scalar divisor too: the frontend has no rule for div.Scalar_mode)
        quotient = call_with_value(graph, _aten.div.Tensor_mode, (numerator, b), out,
                                   {"rounding_mode": "trunc"})
    node.replace_all_uses_with(quotient)
    graph.erase_node(node)
    return True


@workaround(
    id="openvino-integer-division",
    backend="openvino",
    target="OpenVINO CPU plugin: an integer Divide (aten.floor_divide, aten.div rounding_mode floor/trunc)",
    breaks="integer floor division rounds to nearest after a ReduceSum and truncates otherwise: (sum(mask) + 7) // 8 "
    "of 16 ones gives 3 (Nemotron 3.5 Transcribe's and Music Flamingo's audio lengths: one feature too many)",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_program_before_convert(exact_integer_divisions)
