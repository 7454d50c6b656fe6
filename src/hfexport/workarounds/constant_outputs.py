"""ONNX, OpenVINO: a program output that is a Python number is left out of the converted graph, as ``None`` is.

A model may return sizes beside its tensors (MaskFormer's Swin backbone returns each stage's
``hidden_states_spatial_dimensions``, ints). torch.export keeps them as constant outputs of the graph; torch.onnx's
``_handle_output_node`` (torch/onnx/_internal/exporter/_core.py) reads ``.name`` off every output and stops
("'int' object has no attribute 'name'"), where it skips a ``None``; OpenVINO's PyTorch frontend looks the number up
among the graph's values ("4 is not in list"). The export's metadata records every constant output
(``out_constants``) and the runners put them back between the graph's tensor outputs, so each constant in the
program's output node becomes ``None`` before conversion (ONNX: after torch.onnx decomposes the program). Drop each
once its converter skips constant outputs.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["constant_outputs_as_none"]


def constant_outputs_as_none(program: Any) -> int:
    """Replace the numbers, strings and booleans among ``program``'s graph outputs by ``None``, in place; returns
    how many."""
    import torch

    module = program.graph_module
    output = next(n for n in module.graph.nodes if n.op == "output")
    values = output.args[0]
    if not isinstance(values, (tuple, list)):
        return 0
    constant = [v is not None and not isinstance(v, torch.fx.Node) for v in values]
    if not any(constant):
        return 0
    output.args = (type(values)(None if c else v for c, v in zip(constant, values)),)
    module.recompile()
    return sum(constant)


@workaround(
    id="onnx-constant-outputs",
    backend="onnx",
    target="torch.onnx._internal.exporter._core._handle_output_node",
    breaks="a program that returns a Python number (MaskFormer Swin's spatial sizes) fails to convert: "
    "\"'int' object has no attribute 'name'\"",
    upstream="torch/onnx/_internal/exporter/_core.py _handle_output_node; no issue known",
    versions={"torch": ">=2.6,<2.14"},
)
def _apply(model: Any, inputs: dict):
    from ..backends.onnx.translations import around_decomposition

    return around_decomposition(after=constant_outputs_as_none)


@workaround(
    id="openvino-constant-outputs",
    backend="openvino",
    target="openvino.convert_model (an ExportedProgram whose outputs include Python numbers)",
    breaks="a program that returns a Python number (MaskFormer Swin's spatial sizes) fails to convert: "
    "\"4 is not in list\"",
    upstream="OpenVINO PyTorch frontend (torchdynamo / ExportedProgram decoder); no issue known",
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply_openvino(model: Any, inputs: dict):
    from .openvino_convert import rewrite_program_before_convert

    return rewrite_program_before_convert(constant_outputs_as_none)
