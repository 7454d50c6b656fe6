"""``PT2EQuantizer``: PyTorch 2 Export quantization (torchao) of the FX graph, for every backend."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..configs import ExportFormat
from .base import ExportQuantizer, quantizer_workarounds
from .fxgraph import graph_module, reexport

__all__ = ["PT2EQuantizer", "x86_int8", "xnnpack_int8"]


class PT2EQuantizer(ExportQuantizer):
    """Quantize the FX graph with PT2E: ``prepare_pt2e`` inserts observers, the calibration set drives them (one
    forward per sample), ``convert_pt2e`` replaces them with quantize/dequantize ops. Works with every backend.

    Args:
        quantizer: The ``torchao.quantization.pt2e.quantizer.Quantizer`` that annotates the graph. Its ops must be
            ones the target runs: ``X86InductorQuantizer`` for Dynamo/inductor, ONNX (QDQ) or OpenVINO,
            ``XNNPACKQuantizer`` for ExecuTorch.
        calibration_dataset: Input dicts the observers calibrate on (see :class:`ExportQuantizer`). To calibrate
            on batches, pass a ``DataLoader`` that collates samples into batched input dicts.

    Example:
        >>> from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        ...     X86InductorQuantizer, get_default_x86_inductor_quantization_config)
        >>> x86 = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
        >>> DynamoConfig(quantizer=PT2EQuantizer(x86, calibration_dataset=samples))
    """

    quantizes_fx_graph = True
    supported_formats = (ExportFormat.DYNAMO, ExportFormat.ONNX, ExportFormat.OPENVINO, ExportFormat.EXECUTORCH)
    required_packages = {"torchao": "0.11"}

    def __init__(self, quantizer: Any, calibration_dataset: Iterable[dict[str, Any]] | None = None):
        super().__init__(calibration_dataset)
        if quantizer is None or not callable(getattr(quantizer, "annotate", None)):
            raise TypeError(
                f"PT2EQuantizer takes a torchao PT2E Quantizer (X86InductorQuantizer, XNNPACKQuantizer, ...), got "
                f"{type(quantizer).__name__}"
            )
        self.quantizer = quantizer

    def quantize(
        self, model: torch.export.ExportedProgram, sample_inputs: dict[str, Any], export_format: ExportFormat
    ) -> torch.export.ExportedProgram:
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        calibration = self.traced_calibration(sample_inputs)
        module = graph_module(model)
        with quantizer_workarounds(["pt2e-xnnpack-integer-scalars"], module):
            prepared = prepare_pt2e(module, self.quantizer)
        with torch.no_grad():
            for inputs in calibration:
                prepared(**inputs)
        # OpenVINO folds a weight's quantize/dequantize pair into its own compressed weight, but has no conversion
        # for the lone dequantize of an already-folded int8 weight
        quantized = convert_pt2e(prepared, fold_quantize=export_format is not ExportFormat.OPENVINO)
        # XNNPACK's partitioner reads a per-channel weight's scales from the program's own parameters and fails
        # ("ExportedProgram must be provided to extract per channel params") once the replaced fp32 weights are
        # deleted; not understood yet, so ExecuTorch keeps them (its .pte then holds 0.58x the fp32 bytes)
        return reexport(model, quantized, drop_unused=export_format is not ExportFormat.EXECUTORCH)

    def __repr__(self) -> str:
        return f"PT2EQuantizer({type(self.quantizer).__name__})"


def x86_int8(calibration_dataset: Iterable[dict[str, Any]] | None = None) -> PT2EQuantizer:
    """``PT2EQuantizer`` with torchao's ``X86InductorQuantizer`` (int8, per-channel weights): Dynamo, ONNX, OpenVINO."""
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    return PT2EQuantizer(
        X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config()), calibration_dataset
    )


def xnnpack_int8(
    calibration_dataset: Iterable[dict[str, Any]] | None = None, dynamic: bool = False
) -> PT2EQuantizer:
    """``PT2EQuantizer`` with ExecuTorch's ``XNNPACKQuantizer`` (int8 symmetric, per-channel weights, on the
    ``nn.Linear`` layers): ExecuTorch. ``dynamic``: the activations are quantized at run time, per call (XNNPACK's
    dynamically quantized fully-connected), instead of with static calibrated scales."""
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer,
        get_symmetric_quantization_config,
    )

    # the linear layers only: annotating every op also observes the mask arithmetic, whose integer index the
    # prepared graph then refuses ("tensors used as indices must be long") on a calibration forward
    config = get_symmetric_quantization_config(is_per_channel=True, is_dynamic=dynamic)
    return PT2EQuantizer(XNNPACKQuantizer().set_module_type(torch.nn.Linear, config), calibration_dataset)
