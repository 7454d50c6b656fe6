"""OpenVINO: a tensor that a program returns twice is returned the second time through an op of its own.

A model output that holds one tensor in two places (CLIP's vision tower with ``output_hidden_states``: its
``last_hidden_state`` is also the last entry of ``hidden_states``) makes the ``ExportedProgram``'s output node list
one FX node twice, and OpenVINO's PyTorch frontend then fails at ``translate_session.cpp`` with "Tensor name is not a
number: <node name>" (seen with openvino 2026.3.1; an ``aten.clone`` does not help, the frontend makes it an
identity). This wraps ``openvino.convert_model`` so that each repeat of an output becomes ``x * 1`` (``x & x`` for a
bool), a distinct node, before conversion; ``name_ports`` then names every result after its signature entry as
usual. Drop it once the frontend converts a program that returns one node twice (no upstream issue known).
"""

from __future__ import annotations

from typing import Any

from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["split_repeated_outputs"]


def split_repeated_outputs(program: Any) -> int:
    """Give every repeated output of ``program`` (an ``ExportedProgram``) a node of its own, in place; returns how
    many outputs were rewritten."""
    import torch

    from ..capture.graph_passes import separate_repeated_outputs

    def copy(graph: Any, value: Any) -> Any:
        if getattr(value.meta.get("val"), "dtype", None) is torch.bool:
            return graph.call_function(torch.ops.aten.logical_and.default, (value, value))
        return graph.call_function(torch.ops.aten.mul.Tensor, (value, 1))

    return separate_repeated_outputs(program, copy)


@workaround(
    id="openvino-repeated-outputs",
    backend="openvino",
    target="openvino.convert_model (an ExportedProgram returning one node twice)",
    breaks="a program whose outputs hold one tensor twice (CLIP's vision tower: last_hidden_state is also "
    "hidden_states[-1]) fails in the PyTorch frontend: 'Tensor name is not a number: <node>'",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    def rewrite(program: Any) -> Any:
        split_repeated_outputs(program)
        return program

    return rewrite_program_before_convert(rewrite)
