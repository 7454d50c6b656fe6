"""Group-wise weight compression written into an OpenVINO model: int8 with one scale per group, int4 with HQQ's float
zero points. NNCF does neither (its int8 modes keep one scale per output channel; its int4 zero points are u4).

OpenVINO's CPU plugin fuses the compressed-weight pattern ``Convert(codes) [- zero] -> * scale -> Reshape -> MatMul``
into its ``FullyConnected`` for grouped scales and for an f16 / f32 zero point as for a u4 one (measured: 41-43 us per
576x1536 product either way), so this module writes that pattern by hand:

- ``zero_points="none"`` (int8): symmetric codes, one scale per ``group_size`` inputs (round to nearest). A weight
  that came from a block-quantized file (the packaged SmolLM2 is a dequantized GGUF Q4_1, blocks of 32) keeps its
  blocks' ranges, which one scale per output channel mixes.
- ``zero_points="hqq"`` (int4): HQQ (half-quadratic quantization, data-free) codes, scales and float zero points from
  ONNX Runtime's solver (``HQQWeightOnlyQuantizer``). ONNX Runtime's own ``MatMulNBits`` leaves its fast kernels for
  float zero points (650 against 13 us per product), which is why this runs on OpenVINO only.

Layers whose module path matches ``backup_modules`` and the embeddings get NNCF's int8 weight compression with one
scale per output channel, symmetric by default (``INT8_SYM``: SmolLM2's 49152-wide head takes 1.6 ms a step
against 2.4 ms with NNCF's own int4 backup, ``INT8_ASYM``, and 2.7 ms in int8 groups of 32).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from ..configs import ExportFormat
from .base import ExportQuantizer, LibraryArguments

__all__ = ["GroupWeightConfig", "GroupWeightOpenVINOQuantizer", "compress_groups", "hqq_codes"]

logger = logging.getLogger(__name__)

_ZERO_POINTS = {8: ("none",), 4: ("hqq",)}


@dataclasses.dataclass
class GroupWeightConfig(LibraryArguments):
    """Weight-only compression with one scale (and, for int4, one HQQ float zero point) per ``group_size`` inputs.
    Layers whose module path matches a ``backup_modules`` pattern (``re.search``) and the embeddings get NNCF's
    per-channel int8 instead.

    Example:
        >>> GroupWeightConfig(bits=4, zero_points="hqq", group_size=32)
    """

    bits: int = 4
    group_size: int = 32
    #: "none" (symmetric; int8) or "hqq" (HQQ's float zero points; int4)
    zero_points: str = "hqq"
    backup_modules: tuple[str, ...] = (r"(^|\.)lm_head$",)
    #: element type of the scales and zero points: "f16" (NNCF's) or "f32"
    parameter_type: str = "f16"
    #: NNCF's mode for the backup layers and embeddings: "int8_sym" or "int8_asym"
    backup_mode: str = "int8_sym"

    def __post_init__(self) -> None:
        if self.bits not in _ZERO_POINTS:
            raise ValueError(f"GroupWeightConfig.bits must be 4 or 8, got {self.bits}")
        if self.zero_points not in _ZERO_POINTS[self.bits]:
            raise ValueError(
                f"GroupWeightConfig: {self.bits}-bit weights take zero_points={_ZERO_POINTS[self.bits][0]!r}, got "
                f"{self.zero_points!r} (int8 is symmetric; int4 is HQQ's float zero points)"
            )
        if self.group_size < 2 or self.group_size & (self.group_size - 1):
            raise ValueError(f"GroupWeightConfig.group_size must be a power of two, got {self.group_size}")
        if self.parameter_type not in ("f16", "f32"):
            raise ValueError(f"GroupWeightConfig.parameter_type must be 'f16' or 'f32', got {self.parameter_type!r}")
        if self.backup_mode not in ("int8_sym", "int8_asym"):
            raise ValueError(f"GroupWeightConfig.backup_mode must be 'int8_sym' or 'int8_asym', got {self.backup_mode!r}")
        self.backup_modules = tuple(self.backup_modules)


class GroupWeightOpenVINOQuantizer(ExportQuantizer):
    """Compress the converted OpenVINO model's linear weights group-wise (data-free): int8 symmetric or int4 with HQQ
    float zero points; the backup layers and embeddings int8 per channel with NNCF (``backup_mode``).

    Example:
        >>> OpenVINOConfig(quantizer=GroupWeightOpenVINOQuantizer(GroupWeightConfig(bits=8, zero_points="none")))
    """

    supported_formats = (ExportFormat.OPENVINO,)
    row_independent = True  # groups run along each output row's inputs
    # ONNX Runtime's HQQ solver; NNCF for the backup layers
    required_packages = {"onnxruntime": "1.21", "nncf": "2.18", "openvino": "2025.0"}

    def __init__(self, config: GroupWeightConfig | None = None):
        super().__init__(None)
        self.config = GroupWeightConfig() if config is None else config
        self._module_paths: dict[str, str] = {}

    def unsupported_hint(self, export_format: ExportFormat | str) -> str:
        return ("; on ONNX, OnnxRuntimeWeightOnlyConfig (MatMulNBits, the ort-int8 / ort-int4 recipes) quantizes "
                "weights group-wise (its fast kernels take integer zero points only)")

    def read_program(self, program: Any) -> None:
        from .fxgraph import module_paths

        self._module_paths = module_paths(program)

    def quantize(self, model: Any, sample_inputs: dict[str, Any], export_format: ExportFormat) -> Any:
        import nncf

        from .nncf import openvino_nodes_in_modules

        config = self.config
        backup = set(openvino_nodes_in_modules(model, config.backup_modules, self._module_paths))
        done = compress_groups(model, config.bits, config.group_size, skip=backup,
                               parameter_type=config.parameter_type)
        logger.info("%d-bit groups of %d: %d MatMul weights (%d backup layers)", config.bits, config.group_size,
                    done, len(backup))
        # what is left in float: the backup layers, embeddings, weights whose input size the groups do not divide
        return nncf.compress_weights(model, mode=nncf.CompressWeightsMode(config.backup_mode))


def hqq_codes(weight: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``weight`` ([out, in], ``in`` a multiple of ``group_size``) as HQQ int4 codes ([out, in / g, g], 0..15), scales
    and float zero points ([out, in / g, 1]): ``weight ~ (codes - zero) * scale``, ONNX Runtime's solver."""
    import torch
    from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig, HQQWeightOnlyQuantizer

    rows, cols = weight.shape
    solver = HQQWeightOnlyQuantizer(HQQWeightOnlyQuantConfig(block_size=group_size, bits=4))
    codes, scale, zero = solver.quantize_internal(torch.from_numpy(np.array(weight, dtype=np.float32)),
                                                  bits=4, group_size=group_size, axis=1)
    shape = (rows, cols // group_size, 1)
    return (codes.reshape(rows, cols // group_size, group_size).numpy().astype(np.uint8),
            scale.reshape(shape).numpy(), zero.reshape(shape).numpy())


def _int8_codes(weight: np.ndarray, group_size: int, numpy_type: Any) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric int8 codes ([out, in / g, g]) and scales ([out, in / g, 1], rounded to ``numpy_type`` first, so
    the codes are those of the stored scale)."""
    groups = weight.reshape(weight.shape[0], -1, group_size)
    scale = np.abs(groups).max(-1, keepdims=True) / 127
    scale = np.where(scale == 0, 1, scale).astype(numpy_type)
    codes = np.clip(np.round(groups / scale.astype(np.float32)), -127, 127).astype(np.int8)
    return codes, scale


def compress_groups(model: Any, bits: int, group_size: int, skip: set[str] = frozenset(),
                    parameter_type: str = "f16") -> int:
    """Replace each f32 constant 2-D weight of a ``MatMul`` in ``model`` (not named in ``skip``, its input size a
    multiple of ``group_size``) by ``Convert(codes) [- zero] -> * scale -> Reshape``: int8 symmetric for ``bits=8``,
    HQQ int4 (u4 codes, float zero points) for ``bits=4``. Returns how many ``MatMul`` s read a compressed weight."""
    import openvino as ov
    import openvino.opset13 as ops

    from .openvino_weights import float_matmul_weights

    element = ov.Type.f16 if parameter_type == "f16" else ov.Type.f32
    numpy_type = np.float16 if parameter_type == "f16" else np.float32
    replaced: dict[str, Any] = {}  # a constant two MatMuls share is compressed once
    count = 0
    for op, port, source, weight in list(float_matmul_weights(model, lambda name: name not in skip)):
        key = source.get_friendly_name()
        if key not in replaced:
            rows_first = op.get_transpose_b()  # [out, in] as torch's Linear stores it
            # contiguous: openvino 2026.3 makes a strided float16 array an i16 constant
            matrix = np.ascontiguousarray(weight if rows_first else weight.T)
            if matrix.shape[1] % group_size:
                continue
            if bits == 4:
                codes, scale, zero = hqq_codes(matrix, group_size)
                value = ops.convert(ops.constant(codes, dtype=ov.Type.u4, name=f"{key}/codes"), element)
                value = ops.subtract(value, ops.constant(zero.astype(numpy_type), dtype=element))
            else:
                codes, scale = _int8_codes(matrix, group_size, numpy_type)
                value = ops.convert(ops.constant(codes, name=f"{key}/codes"), element)
            value = ops.multiply(value, ops.constant(scale.astype(numpy_type), dtype=element))
            value = ops.reshape(value, ops.constant(np.array(matrix.shape, dtype=np.int64)), False)
            if element != ov.Type.f32:
                value = ops.convert(value, ov.Type.f32)
            if not rows_first:
                value = ops.transpose(value, ops.constant(np.array([1, 0], dtype=np.int64)))
            replaced[key] = value.output(0)
        port.replace_source_output(replaced[key])
        count += 1
    return count
