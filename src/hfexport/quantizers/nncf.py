"""NNCF quantizers: ``nncf.quantize`` (int8 activations and weights) or ``nncf.compress_weights`` (weight-only int8
/ int4) on the FX graph (:class:`NNCFTorchFXQuantizer`), the converted OpenVINO model (:class:`NNCFOpenVINOQuantizer`)
or the converted ONNX model (:class:`NNCFOnnxQuantizer`). NNCF picks its backend from the model's type; each class
says which model it takes and maps the calibration samples to that model's inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch

from ..configs import ExportFormat
from ..errors import UnsupportedError
from .base import CalibrationSet, ExportQuantizer, LibraryArguments, _is_traced_key
from .calibration import flat_feeds, numpy_dtype
from .fxgraph import graph_module, reexport

__all__ = [
    "NNCFQuantizationConfig",
    "NNCFWeightCompressionConfig",
    "NNCFOpenVINOQuantizer",
    "NNCFOnnxQuantizer",
    "NNCFTorchFXQuantizer",
]


@dataclasses.dataclass
class NNCFQuantizationConfig(LibraryArguments):
    """Arguments of ``nncf.quantize``: int8 activations and weights, calibrated on the quantizer's
    ``calibration_dataset``. A field left ``None`` keeps NNCF's default, except ``model_type``, which defaults to
    ``nncf.ModelType.TRANSFORMER``.

    Example:
        >>> OpenVINOConfig(quantizer=NNCFOpenVINOQuantizer(NNCFQuantizationConfig(subset_size=64), samples))
    """

    mode: Any = None
    preset: Any = None
    target_device: Any = None
    subset_size: int | None = None
    fast_bias_correction: bool | None = None
    model_type: Any = None
    ignored_scope: Any = None
    advanced_parameters: Any = None


@dataclasses.dataclass
class NNCFWeightCompressionConfig(LibraryArguments):
    """Arguments of ``nncf.compress_weights``: weight-only int8 or int4, with data-aware methods (AWQ, scale
    estimation, GPTQ) for the int4 modes. The int8 modes are data-free; the others calibrate on the quantizer's
    ``calibration_dataset``. ``gptq`` and ``lora_correction`` are OpenVINO-only. A field left ``None`` keeps NNCF's
    default.

    Example:
        >>> import nncf
        >>> NNCFWeightCompressionConfig(mode=nncf.CompressWeightsMode.INT4_SYM, group_size=32, awq=True)
    """

    mode: Any = None
    ratio: float | None = None
    group_size: int | None = None
    ignored_scope: Any = None
    all_layers: bool | None = None
    sensitivity_metric: Any = None
    subset_size: int | None = None
    awq: bool | None = None
    scale_estimation: bool | None = None
    gptq: bool | None = None
    lora_correction: bool | None = None
    backup_mode: Any = None
    compression_format: Any = None
    advanced_parameters: Any = None

    def is_data_free(self) -> bool:
        """Whether ``compress_weights`` runs without a dataset (the int8 modes; NNCF refuses one for them)."""
        mode = getattr(self.mode, "value", self.mode)
        return mode is None or str(mode).lower() in ("int8_sym", "int8_asym", "int8")


class _NNCFQuantizer(ExportQuantizer):
    """Runs ``nncf.quantize`` or ``nncf.compress_weights``, as its config says."""

    def __init__(
        self,
        config: NNCFQuantizationConfig | NNCFWeightCompressionConfig | None = None,
        calibration_dataset: Iterable[dict[str, Any]] | None = None,
        *,
        weight_only_modules: Iterable[str] = (),
    ):
        super().__init__(calibration_dataset, weight_only_modules=weight_only_modules)
        config = NNCFQuantizationConfig() if config is None else config
        if not isinstance(config, NNCFQuantizationConfig | NNCFWeightCompressionConfig):
            raise TypeError(
                f"{type(self).__name__} takes an NNCFQuantizationConfig or NNCFWeightCompressionConfig, got "
                f"{type(config).__name__}"
            )
        self.config = config

    def check_options(self, export_format: ExportFormat | str) -> None:
        config = self.config
        if isinstance(config, NNCFWeightCompressionConfig) and not isinstance(self, NNCFOpenVINOQuantizer):
            only_openvino = [name for name in ("gptq", "lora_correction") if getattr(config, name)]
            if only_openvino:
                raise UnsupportedError(
                    f"{type(self).__name__}: {', '.join(only_openvino)} of NNCFWeightCompressionConfig run on "
                    "OpenVINO models only; use NNCFOpenVINOQuantizer with an OpenVINO export"
                )

    def _run(self, model: Any, calibration: CalibrationSet, ignored: list[str] = ()) -> Any:
        """``nncf.quantize`` (leaving the nodes ``ignored`` in float) or ``nncf.compress_weights``."""
        import nncf

        if isinstance(self.config, NNCFQuantizationConfig):
            kwargs = self.config.to_kwargs()
            kwargs.setdefault("model_type", nncf.ModelType.TRANSFORMER)
            if ignored:
                kwargs["ignored_scope"] = _with_names(kwargs.get("ignored_scope"), ignored)
            return nncf.quantize(model, nncf.Dataset(calibration), **kwargs)
        dataset = None if self.config.is_data_free() else nncf.Dataset(calibration)
        return nncf.compress_weights(model, dataset=dataset, **self.config.to_kwargs())


class NNCFTorchFXQuantizer(_NNCFQuantizer):
    """Quantize the ``torch.export`` FX graph with NNCF's TorchFX backend, before any conversion, so every backend
    takes the result. ExecuTorch lowers only the weight-only result (:class:`NNCFWeightCompressionConfig`): XNNPACK
    does not delegate the quantize/dequantize ops ``nncf.quantize`` inserts, and ExecuTorch has no kernels for them.

    Example:
        >>> DynamoConfig(quantizer=NNCFTorchFXQuantizer(calibration_dataset=samples))
    """

    quantizes_fx_graph = True
    supported_formats = (ExportFormat.DYNAMO, ExportFormat.ONNX, ExportFormat.OPENVINO, ExportFormat.EXECUTORCH)
    required_packages = {"nncf": "2.18"}

    def check_options(self, export_format: ExportFormat | str) -> None:
        super().check_options(export_format)
        if export_format == ExportFormat.EXECUTORCH and isinstance(self.config, NNCFQuantizationConfig):
            raise UnsupportedError(
                "NNCFTorchFXQuantizer with NNCFQuantizationConfig cannot serve an ExecuTorch export: XNNPACK does not "
                "delegate its quantize/dequantize ops and ExecuTorch has no kernels for them; use "
                "NNCFWeightCompressionConfig (weight-only), or PT2EQuantizer with XNNPACKQuantizer"
            )
        mode = str(getattr(getattr(self.config, "mode", None), "name", getattr(self.config, "mode", "")) or "")
        four_bit = "INT4" in mode.upper() or mode.upper().startswith(("NF4", "E2M1", "MXFP4", "CB4", "FP4"))
        if export_format == ExportFormat.EXECUTORCH and four_bit:
            raise UnsupportedError(
                f"NNCFTorchFXQuantizer with a 4-bit weight compression ({mode}) cannot serve an ExecuTorch export: "
                "NNCF 3.x unpacks the two 4-bit weights of each byte with aten.bitwise_right_shift, which is outside "
                "the core ATen opset ExecuTorch's to_edge accepts (SpecViolationError, executorch 1.5.1); use an "
                "8-bit mode (INT8_SYM / INT8_ASYM), or the nncf-int4 recipe on OpenVINO, ONNX or Dynamo"
            )

    def quantize(
        self, model: torch.export.ExportedProgram, sample_inputs: dict[str, Any], export_format: ExportFormat
    ) -> torch.export.ExportedProgram:
        with torch.no_grad():
            quantized = self._run(graph_module(model), self.traced_calibration(sample_inputs))
        return reexport(model, quantized)


class NNCFOpenVINOQuantizer(_NNCFQuantizer):
    """Quantize the converted OpenVINO model with NNCF: ``nncf.quantize`` with an :class:`NNCFQuantizationConfig`
    (the default), or ``nncf.compress_weights`` with an :class:`NNCFWeightCompressionConfig`. It runs before the
    cache is folded into state, so each sample's cache is fed as an input.

    Example:
        >>> import nncf
        >>> OpenVINOConfig(quantizer=NNCFOpenVINOQuantizer(calibration_dataset=samples))
        >>> OpenVINOConfig(
        ...     quantizer=NNCFOpenVINOQuantizer(NNCFWeightCompressionConfig(mode=nncf.CompressWeightsMode.INT4_SYM)))
    """

    supported_formats = (ExportFormat.OPENVINO,)
    required_packages = {"nncf": "2.18", "openvino": "2025.0"}

    def unsupported_hint(self, export_format: ExportFormat | str) -> str:
        return "; NNCFOnnxQuantizer quantizes ONNX exports, NNCFTorchFXQuantizer the FX graph of any export"

    def read_program(self, program: Any) -> None:
        """The module path of each FX node: the PyTorch frontend names an op after its node (``linear_6/...``)."""
        from .fxgraph import module_paths

        self._module_paths = module_paths(program)

    def quantize(self, model: Any, sample_inputs: dict[str, Any], export_format: ExportFormat) -> Any:
        keys = [k for k in sample_inputs if _is_traced_key(k)]
        names = [port.get_any_name() for port in model.inputs]
        dtypes = [numpy_dtype(port.get_element_type().to_dtype().name) for port in model.inputs]
        calibration = CalibrationSet(
            self.calibration_dataset, sample_inputs, lambda s: flat_feeds(s, keys, names, dtypes)
        )
        weight_only = openvino_nodes_in_modules(model, self.weight_only_modules, getattr(self, "_module_paths", {}))
        quantized = self._run(model, calibration, weight_only)
        if weight_only and isinstance(self.config, NNCFQuantizationConfig):
            _openvino_int8_weight_only(quantized, set(weight_only))
        return quantized


class NNCFOnnxQuantizer(_NNCFQuantizer):
    """Quantize the converted ONNX model with NNCF's ONNX backend: ``nncf.quantize`` with an
    :class:`NNCFQuantizationConfig` (the default, int8 QDQ), or ``nncf.compress_weights`` with an
    :class:`NNCFWeightCompressionConfig` (int4 as ONNX Runtime's ``MatMulNBits``).

    Example:
        >>> OnnxConfig(quantizer=NNCFOnnxQuantizer(calibration_dataset=samples))
    """

    supported_formats = (ExportFormat.ONNX,)
    # NNCF's ONNX backend calibrates through ONNX Runtime
    required_packages = {"nncf": "2.18", "onnx": "1.18", "onnx-ir": "0.1.12", "onnxruntime": "1.21"}

    def unsupported_hint(self, export_format: ExportFormat | str) -> str:
        return "; NNCFOpenVINOQuantizer quantizes OpenVINO exports, NNCFTorchFXQuantizer the FX graph of any export"

    def quantize(self, model: Any, sample_inputs: dict[str, Any], export_format: ExportFormat) -> Any:
        import onnx_ir as ir

        from .onnxruntime import onnx_calibration

        from .onnx_gather import gather_before_dequantize
        from .onnx_weights import int8_weight_only, nodes_in_modules

        _fold_weight_transposes(model)
        weight_only = nodes_in_modules(model, self.weight_only_modules, ("MatMul", "Gather"))
        calibration = onnx_calibration(model, sample_inputs, self.calibration_dataset)
        quantized = ir.serde.deserialize_model(self._run(ir.serde.serialize_model(model), calibration, weight_only))
        if isinstance(self.config, NNCFQuantizationConfig):
            int8_weight_only(quantized, weight_only)  # NNCF keeps the names of the nodes it leaves alone
        # an int8 embedding (NNCF's backup mode, or ours): dequantize the looked-up rows only, from a tied lm_head's
        # copy when it holds the same codes
        gather_before_dequantize(quantized)
        return quantized


def _with_names(ignored_scope: Any, names: list[str]) -> Any:
    """``ignored_scope`` (an ``nncf.IgnoredScope`` or ``None``) with ``names`` added."""
    import nncf

    if ignored_scope is None:
        return nncf.IgnoredScope(names=list(names))
    return dataclasses.replace(ignored_scope, names=[*ignored_scope.names, *names])


def openvino_nodes_in_modules(model: Any, patterns: Iterable[str], paths: dict[str, str]) -> list[str]:
    """Friendly names of the ``MatMul`` ops of an OpenVINO model converted from an ``ExportedProgram`` whose module
    path matches one of ``patterns``: the frontend names each op after its FX node (``linear_6/aten.linear.default/
    MatMul``), ``paths`` maps node names to module paths (:meth:`NNCFOpenVINOQuantizer.read_program`)."""
    import re

    compiled = [re.compile(p) for p in patterns]
    if not compiled:
        return []
    out = []
    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul":
            continue
        path = paths.get(op.get_friendly_name().split("/")[0], "")
        if path and any(p.search(path) for p in compiled):
            out.append(op.get_friendly_name())
    return out


def _openvino_int8_weight_only(model: Any, names: set[str]) -> None:
    """Store the f32 constant weight of each named ``MatMul`` as int8 with one scale per output channel
    (``Constant(i8) -> Convert -> Multiply``, the compressed-weight pattern OpenVINO's CPU plugin runs as is)."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    from .openvino_weights import float_matmul_weights

    for op, port, source, weight in list(float_matmul_weights(model, names.__contains__)):
        axis = 1 if op.get_transpose_b() else 0  # the reduced (input) axis
        scale = np.abs(weight).max(axis=axis, keepdims=True) / 127.0
        scale = np.where(scale == 0, 1.0, scale).astype(np.float32)
        q = np.clip(np.round(weight / scale), -127, 127).astype(np.int8)
        name = source.get_friendly_name()
        dequantized = ops.multiply(ops.convert(ops.constant(q, name=f"{name}/int8"), ov.Type.f32), ops.constant(scale))
        port.replace_source_output(dequantized.output(0))


def _fold_weight_transposes(model: Any) -> None:
    """Fold each ``Transpose`` of an initializer into a transposed initializer: NNCF quantizes a ``MatMul`` only
    when its weight is an initializer, and the ONNX optimiser leaves a large one (a tied ``lm_head``) unfolded."""
    import numpy as np
    import onnx_ir as ir

    graph = model.graph
    for node in list(graph):
        if node.op_type != "Transpose" or not node.inputs[0].is_initializer():
            continue
        source = node.inputs[0]
        perm = node.attributes["perm"].as_ints() if "perm" in node.attributes else None
        out = node.outputs[0]
        data = np.transpose(source.const_value.numpy(), perm)
        folded = ir.Value(name=f"{out.name}_folded", shape=ir.Shape(data.shape), type=out.type,
                          const_value=ir.tensor(data, name=f"{out.name}_folded"))
        graph.register_initializer(folded)
        ir.convenience.replace_all_uses_with(out, folded)
        graph.remove(node, safe=True)
        if not source.uses() and source.name in graph.initializers and not source.is_graph_output():
            del graph.initializers[source.name]
