"""OpenVINO: a size read with ``.item()`` from an int32 tensor (``aten.item`` / ``_local_scalar_dense``) made from
an int64 one.

OpenVINO's PyTorch frontend converts the read as a ``Squeeze`` that keeps the tensor's element type, and a shape
built from it (a ``view`` whose sizes mix the read with the constants the frontend writes as i64) becomes a
``Concat`` of i64 and i32 parts, which its ``SequenceMarkReplacer`` refuses ("Argument element types are
inconsistent", openvino 2026.3.1; ``SequenceMark, aten.view.default`` in the unconverted-ops report). MiniCPM-V's
vision towers read their patch grids from an int32 ``target_sizes``. Before conversion, each such read takes its
tensor cast to int64 (``aten._to_copy``): the same value, read at the width the frontend gives every other size.
Drop it once the frontend converts the read to i64 (or casts the parts of a shape list to one type).
"""

from __future__ import annotations

from typing import Any

import torch

from ..capture.graph_passes import call_with_value, rewrite_nodes, traced
from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["int64_item_reads"]

_READS = frozenset((torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default))
_NARROW = frozenset((torch.int8, torch.int16, torch.int32, torch.uint8))


def int64_item_reads(program: Any) -> int:
    """Cast the narrow-integer tensor each ``item`` read takes to int64 in ``program``, in place; returns how many."""
    return rewrite_nodes(program, _widen_read)


def _widen_read(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    if node.target not in _READS or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    source = node.args[0]
    value = traced(source)
    if not isinstance(value, torch.Tensor) or value.dtype not in _NARROW:
        return False
    with graph.inserting_before(node):
        wide = call_with_value(graph, torch.ops.aten._to_copy.default, (source,), value.to(torch.int64),
                               {"dtype": torch.int64})
    node.args = (wide, *node.args[1:])
    return True


@workaround(
    id="openvino-int32-item",
    backend="openvino",
    target="OpenVINO PyTorch frontend: aten.item / _local_scalar_dense of an int32 tensor (a Squeeze kept i32)",
    breaks="a shape built from a size read off an int32 tensor does not convert: the frontend's SequenceMarkReplacer "
    "concatenates its i32 with i64 constants (Argument element types are inconsistent; MiniCPM-V's vision towers, "
    "target_sizes)",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_program_before_convert(int64_item_reads)
