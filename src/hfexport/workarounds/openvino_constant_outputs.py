"""OpenVINO: a program output that is a Python number is left out of the converted model, as a ``None`` is.

MaskFormer's Swin backbone returns each stage's spatial sizes (ints) beside its tensors; OpenVINO's PyTorch frontend
looks such a number up among the graph's values and stops ("4 is not in list"). The export's metadata records every
constant output and the runner puts them back, so each constant in the program's output node becomes ``None``
before conversion (:func:`~hfexport.capture.graph_passes.constant_outputs_as_none`, as for ONNX). Drop it once the
frontend skips constant outputs.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround


@workaround(
    id="openvino-constant-outputs",
    backend="openvino",
    target="openvino.convert_model (an ExportedProgram whose outputs include Python numbers)",
    breaks="a program that returns a Python number (MaskFormer Swin's spatial sizes) fails to convert: "
    "\"4 is not in list\"",
    upstream="OpenVINO PyTorch frontend (torchdynamo / ExportedProgram decoder); no issue known",
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    from ..capture.graph_passes import constant_outputs_as_none
    from .openvino_convert import rewrite_program_before_convert

    return rewrite_program_before_convert(constant_outputs_as_none)
