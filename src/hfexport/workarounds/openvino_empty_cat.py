"""OpenVINO: drop the empty 1-D tensors that transformers' ``DynamicLayer`` concatenates a first K/V onto.

A ``DynamicCache`` layer starts as ``torch.tensor([])`` and its first update is ``torch.cat([empty, key_states],
dim=-2)``: torch accepts a 1-D empty tensor in a concatenation of 4-D ones (legacy rule), OpenVINO's PyTorch frontend
does not ("Axis -2 out of the tensor rank range [-1, 0]"), so no graph that starts a dynamic cache (a prefill)
converts. The empty operand adds nothing: this wraps ``openvino.convert_model`` to remove it from every
``aten.cat`` of the program first. Drop it once the frontend follows torch's legacy rule (or transformers allocates
the first K/V without the empty tensor).
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["drop_empty_cat_operands"]


def _is_empty_1d(node: Any) -> bool:
    value = getattr(node, "meta", {}).get("val")
    shape = getattr(value, "shape", None)
    return shape is not None and len(shape) == 1 and shape[0] == 0


def drop_empty_cat_operands(program: Any) -> int:
    """Remove 1-D empty operands from the ``aten.cat`` nodes of an ``ExportedProgram`` (in place); returns how many."""
    import torch

    from ..capture.graph_passes import program_graphs

    count = 0
    for module, graph in program_graphs(program):
        changed = False
        for node in graph.nodes:
            if node.op != "call_function" or node.target is not torch.ops.aten.cat.default:
                continue
            operands = list(node.args[0])
            kept = [a for a in operands if not _is_empty_1d(a)]
            if len(kept) == len(operands) or not kept:
                continue
            node.args = (kept, *node.args[1:])
            count += len(operands) - len(kept)
            changed = True
        if changed and isinstance(module, torch.fx.GraphModule):
            module.recompile()
    return count


@workaround(
    id="openvino-empty-cat",
    backend="openvino",
    target="openvino.convert_model (aten.cat of a 1-D empty tensor)",
    breaks="a prefill that starts a DynamicCache does not convert: torch.cat([tensor([]), keys], dim=-2) is "
    "rejected by OpenVINO's PyTorch frontend (Axis -2 out of the tensor rank range)",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    from .openvino_convert import rewrite_program_before_convert

    return rewrite_program_before_convert(drop_empty_cat_operands)
