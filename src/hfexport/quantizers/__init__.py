"""Post-training quantizers applied during export.

Each quantizer module imports its library (torchao, onnxruntime, nncf) only when it quantizes, so importing these
names is light.
"""

from .base import CalibrationSet, ExportQuantizer
from .nncf import (
    NNCFOnnxQuantizer,
    NNCFOpenVINOQuantizer,
    NNCFQuantizationConfig,
    NNCFTorchFXQuantizer,
    NNCFWeightCompressionConfig,
)
from .onnxruntime import (
    OnnxRuntimeDynamicConfig,
    OnnxRuntimeQuantizer,
    OnnxRuntimeStaticConfig,
    OnnxRuntimeWeightOnlyConfig,
)
from .openvino_groups import GroupWeightConfig, GroupWeightOpenVINOQuantizer
from .pt2e import PT2EQuantizer
from .torchao import TorchAOQuantizer

__all__ = [
    "ExportQuantizer",
    "CalibrationSet",
    "PT2EQuantizer",
    "OnnxRuntimeQuantizer",
    "OnnxRuntimeStaticConfig",
    "OnnxRuntimeDynamicConfig",
    "OnnxRuntimeWeightOnlyConfig",
    "NNCFOpenVINOQuantizer",
    "NNCFOnnxQuantizer",
    "NNCFTorchFXQuantizer",
    "NNCFQuantizationConfig",
    "NNCFWeightCompressionConfig",
    "TorchAOQuantizer",
    "GroupWeightOpenVINOQuantizer",
    "GroupWeightConfig",
]
