"""``OnnxRuntimeQuantizer``: ONNX Runtime's own quantization (``onnxruntime.quantization``) of the converted graph."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..configs import ExportFormat
from .base import CalibrationSet, ExportQuantizer, LibraryArguments, _is_traced_key, quantizer_workarounds
from .calibration import flat_feeds, numpy_dtype

__all__ = ["OnnxRuntimeQuantizer", "OnnxRuntimeStaticConfig", "OnnxRuntimeDynamicConfig", "OnnxRuntimeWeightOnlyConfig"]


@dataclasses.dataclass
class OnnxRuntimeStaticConfig(LibraryArguments):
    """Arguments of ``onnxruntime.quantization.quantize_static``: int8 activations and weights (QDQ by default),
    calibrated on the quantizer's ``calibration_dataset``. A field left ``None`` keeps ONNX Runtime's default.

    Example:
        >>> OnnxConfig(quantizer=OnnxRuntimeQuantizer(OnnxRuntimeStaticConfig(per_channel=True), samples))
    """

    quant_format: Any = None
    op_types_to_quantize: list[str] | None = None
    per_channel: bool | None = None
    reduce_range: bool | None = None
    activation_type: Any = None
    weight_type: Any = None
    nodes_to_quantize: list[str] | None = None
    nodes_to_exclude: list[str] | None = None
    calibrate_method: Any = None
    calibration_providers: list[str] | None = None
    extra_options: dict[str, Any] | None = None


@dataclasses.dataclass
class OnnxRuntimeDynamicConfig(LibraryArguments):
    """Arguments of ``onnxruntime.quantization.quantize_dynamic``: int8 weights, activations quantized at run time,
    no calibration. A field left ``None`` keeps ONNX Runtime's default.

    Example:
        >>> OnnxConfig(quantizer=OnnxRuntimeQuantizer(OnnxRuntimeDynamicConfig()))
    """

    op_types_to_quantize: list[str] | None = None
    per_channel: bool | None = None
    reduce_range: bool | None = None
    weight_type: Any = None
    nodes_to_quantize: list[str] | None = None
    nodes_to_exclude: list[str] | None = None
    extra_options: dict[str, Any] | None = None


@dataclasses.dataclass
class OnnxRuntimeWeightOnlyConfig(LibraryArguments):
    """Arguments of ``onnxruntime.quantization.matmul_nbits_quantizer.MatMulNBitsQuantizer``: block-wise int4 or int8
    weights, float activations, no calibration. Each ``MatMul`` with a constant weight becomes ONNX Runtime's
    ``MatMulNBits`` (with ``accuracy_level=4`` its CPU kernel quantizes the activations to int8 on the fly and runs
    the int8 dot products), and, at 4 bits, each embedding ``Gather`` a ``GatherBlockQuantized``. An 8-bit embedding
    table, which ONNX Runtime's quantizer leaves float, is stored as int8 per row and only the looked-up rows are
    dequantized. Fused attention (``GroupQueryAttention``) and the other contrib ops stay as they are.

    ``algorithm``: ``"DEFAULT"`` (round to nearest in each block) or ``"HQQ"`` (half-quadratic optimisation of each
    block's scale and zero point, data-free; asymmetric, MatMul only: more accurate than rounding, but its float
    zero points run on ONNX Runtime's slow MatMulNBits path, about 50x slower per product on CPU, unless
    ``split_zero_points``). ``split_zero_points`` (HQQ only): keep each product on ``MatMulNBits``' fast kernel
    without zero points and add the blocks' float offsets as a separate product of the input's block sums, a
    thirty-second of the weight's size at blocks of 32 (:mod:`~hfexport.quantizers.onnx_offsets`).
    ``int8_modules``: regular expressions
    (``re.search``) over module paths (``lm_head``) whose MatMuls get 8 bits instead of ``bits`` (round to nearest).

    Example:
        >>> OnnxConfig(ort_fusions="cpu", quantizer=OnnxRuntimeQuantizer(OnnxRuntimeWeightOnlyConfig(bits=4)))
    """

    bits: int = 4
    block_size: int = 32
    is_symmetric: bool = True
    accuracy_level: int | None = 4
    algorithm: str = "DEFAULT"
    op_types_to_quantize: tuple[str, ...] = ("MatMul", "Gather")
    nodes_to_exclude: list[str] | None = None
    int8_modules: tuple[str, ...] = ()
    split_zero_points: bool = False

    def __post_init__(self) -> None:
        if self.bits not in (4, 8):
            raise ValueError(f"OnnxRuntimeWeightOnlyConfig(bits={self.bits}): MatMulNBits takes 4 or 8 bits")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise ValueError(f"OnnxRuntimeWeightOnlyConfig(block_size={self.block_size}): a power of two >= 16")
        if self.algorithm not in ("DEFAULT", "HQQ"):
            raise ValueError(f"OnnxRuntimeWeightOnlyConfig(algorithm={self.algorithm!r}): 'DEFAULT' or 'HQQ'")
        if self.split_zero_points and self.algorithm != "HQQ":
            raise ValueError(
                "OnnxRuntimeWeightOnlyConfig(split_zero_points=True) splits HQQ's float zero points; with "
                f"algorithm={self.algorithm!r} the zero points are integers MatMulNBits' fast kernels take: use "
                "algorithm='HQQ'"
            )


class OnnxRuntimeQuantizer(ExportQuantizer):
    """Quantize the converted ONNX model with ONNX Runtime's tools: ``quantize_static`` with an
    :class:`OnnxRuntimeStaticConfig` (the default), ``quantize_dynamic`` with an :class:`OnnxRuntimeDynamicConfig`,
    or ``MatMulNBitsQuantizer`` (block-wise int4/int8 weights) with an :class:`OnnxRuntimeWeightOnlyConfig`.

    Example:
        >>> static = OnnxRuntimeStaticConfig(per_channel=True)
        >>> OnnxConfig(quantizer=OnnxRuntimeQuantizer(static, calibration_dataset=samples))
        >>> OnnxConfig(quantizer=OnnxRuntimeQuantizer(OnnxRuntimeDynamicConfig()))
    """

    supported_formats = (ExportFormat.ONNX,)
    required_packages = {"onnx": "1.18", "onnx-ir": "0.1.12", "onnxruntime": "1.21"}

    def __init__(
        self,
        config: OnnxRuntimeStaticConfig | OnnxRuntimeDynamicConfig | OnnxRuntimeWeightOnlyConfig | None = None,
        calibration_dataset: Iterable[dict[str, Any]] | None = None,
        *,
        weight_only_modules: Iterable[str] = (),
    ):
        super().__init__(calibration_dataset, weight_only_modules=weight_only_modules)
        config = OnnxRuntimeStaticConfig() if config is None else config
        if not isinstance(config, OnnxRuntimeStaticConfig | OnnxRuntimeDynamicConfig | OnnxRuntimeWeightOnlyConfig):
            raise TypeError(
                f"OnnxRuntimeQuantizer takes an OnnxRuntimeStaticConfig, OnnxRuntimeDynamicConfig or "
                f"OnnxRuntimeWeightOnlyConfig, got {type(config).__name__}"
            )
        self.config = config

    def unsupported_hint(self, export_format: ExportFormat | str) -> str:
        return "; to quantize for every backend, use PT2EQuantizer or NNCFTorchFXQuantizer (on the FX graph)"

    def quantize(self, model: Any, sample_inputs: dict[str, Any], export_format: ExportFormat) -> Any:
        import onnx_ir as ir

        from .onnx_gather import gather_before_dequantize
        from .onnx_nbits import load_in_memory, quantize_nbits
        from .onnx_weights import int8_weight_only, nodes_in_modules

        if isinstance(self.config, OnnxRuntimeWeightOnlyConfig):
            return quantize_nbits(model, self.config)
        weight_only = nodes_in_modules(model, self.weight_only_modules, ("MatMul",))  # ONNX Runtime does the embedding
        with tempfile.TemporaryDirectory() as tmp:
            # quantize from and to files with external data: a model past protobuf's 2 GB limit works too
            source, target = Path(tmp, "model.onnx"), Path(tmp, "quantized.onnx")
            ir.save(model, source, external_data="model.onnx.data")
            with quantizer_workarounds(["onnxruntime-quantize-standard-attention"], model):
                self._quantize(model, source, target, sample_inputs, weight_only)
            quantized = ir.load(target)
            load_in_memory(quantized)  # before the temporary directory goes
        int8_weight_only(quantized, weight_only)  # ONNX Runtime left them float (nodes_to_exclude keeps their names)
        gather_before_dequantize(quantized)  # an int8 embedding: dequantize the looked-up rows only
        return quantized

    def _quantize(
        self, model: Any, source: Path, target: Path, sample_inputs: dict[str, Any], weight_only: list[str]
    ) -> None:
        from onnxruntime.quantization import quantize_dynamic, quantize_static

        kwargs = self.config.to_kwargs()
        if weight_only:
            kwargs["nodes_to_exclude"] = [*(kwargs.get("nodes_to_exclude") or []), *weight_only]
        if isinstance(self.config, OnnxRuntimeDynamicConfig):
            _drop_initializer_value_info(source)
            quantize_dynamic(source, target, use_external_data_format=True, **kwargs)
        else:
            quantize_static(
                source, target, _FeedReader(onnx_calibration(model, sample_inputs, self.calibration_dataset)),
                use_external_data_format=True, **kwargs,
            )


def onnx_calibration(model: Any, sample_inputs: dict[str, Any], dataset: Any) -> CalibrationSet:
    """Calibration samples as feeds of the ONNX ``model``'s graph inputs."""
    keys = [k for k in sample_inputs if _is_traced_key(k)]
    names = [v.name for v in model.graph.inputs]
    dtypes = [numpy_dtype(v.dtype.numpy().name) for v in model.graph.inputs]
    return CalibrationSet(dataset, sample_inputs, lambda s: flat_feeds(s, keys, names, dtypes))


def _drop_initializer_value_info(path: Path) -> None:
    """``quantize_dynamic`` transposes ``Gemm`` weights, then re-infers shapes and trips over an initializer's stale
    ``value_info``: drop those entries first."""
    import onnx

    proto = onnx.load(str(path), load_external_data=False)
    initializers = {i.name for i in proto.graph.initializer}
    kept = [info for info in proto.graph.value_info if info.name not in initializers]
    del proto.graph.value_info[:]
    proto.graph.value_info.extend(kept)
    onnx.save(proto, str(path))


class _FeedReader:
    """The ``CalibrationDataReader`` protocol ``quantize_static`` reads (``get_next``, ``rewind``)."""

    def __init__(self, calibration: CalibrationSet):
        self.calibration = calibration
        self._feeds = iter(calibration)

    def get_next(self) -> dict | None:
        return next(self._feeds, None)

    def rewind(self) -> None:
        self._feeds = iter(self.calibration)
