"""ONNX: a program output that is a Python number is left out of the ONNX graph, as a ``None`` output is.

A model may return sizes beside its tensors (MaskFormer's Swin backbone returns each stage's
``hidden_states_spatial_dimensions``, ints). torch.export keeps them as constant outputs of the graph; torch.onnx's
``_handle_output_node`` (torch/onnx/_internal/exporter/_core.py) reads ``.name`` off every output and stops
("'int' object has no attribute 'name'"), where it skips a ``None``. The export's metadata records every constant
output (``out_constants``) and the runner puts them back between the graph's tensor outputs, so after torch.onnx
decomposes the program each constant in its output node becomes ``None``
(:func:`~hfexport.capture.graph_passes.constant_outputs_as_none`). Drop it once torch.onnx skips constant outputs.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround


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
    from ..capture.graph_passes import constant_outputs_as_none

    return around_decomposition(after=constant_outputs_as_none)
