"""hfexport: export Hugging Face transformers models to torch.export, ONNX, ExecuTorch and OpenVINO, and run them.

``import hfexport`` loads torch and transformers only; each backend (and its runtime: onnxruntime, executorch,
openvino) is imported the first time one of its names is used.

Example:
    >>> from hfexport import DynamoExporter, DynamoConfig, ExportedModel
    >>> exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    >>> exported.save_pretrained("out")
    >>> ExportedModel.from_pretrained("out")(**inputs).logits
"""

from __future__ import annotations

import importlib
from typing import Any

from ._versions import __version__

from .configs import (
    DynamoConfig,
    ExecutorchConfig,
    ExportConfigMixin,
    ExportFormat,
    OnnxConfig,
    OpenVINOConfig,
)
from .errors import ConfigError, ExportError, HfExportError, ManifestError, MissingPackageError, UnsupportedError
from .exported import ExportedComponent, ExportedModel
from .exporter import HfExporter
from .metadata import ExportMetadata, IORole, TensorSpec
from .quantizers import (
    CalibrationSet,
    ExportQuantizer,
    NNCFOnnxQuantizer,
    NNCFOpenVINOQuantizer,
    NNCFQuantizationConfig,
    NNCFTorchFXQuantizer,
    NNCFWeightCompressionConfig,
    OnnxRuntimeDynamicConfig,
    OnnxRuntimeQuantizer,
    OnnxRuntimeStaticConfig,
    PT2EQuantizer,
)
from .registry import AutoExportConfig, AutoHfExporter, register_backend
from .runner import ModelRunner

# name -> "module:attribute", imported on first access so that backends stay unloaded until used
_LAZY = {
    "DynamoExporter": "hfexport.backends.dynamo.exporter:DynamoExporter",
    "OnnxExporter": "hfexport.backends.onnx.exporter:OnnxExporter",
    "ExecutorchExporter": "hfexport.backends.executorch.exporter:ExecutorchExporter",
    "OpenVINOExporter": "hfexport.backends.openvino.exporter:OpenVINOExporter",
}

__all__ = [
    # configs
    "ExportFormat",
    "ExportConfigMixin",
    "DynamoConfig",
    "OnnxConfig",
    "ExecutorchConfig",
    "OpenVINOConfig",
    "AutoExportConfig",
    # exporters
    "HfExporter",
    "AutoHfExporter",
    "register_backend",
    *_LAZY,
    # exported models
    "ExportedModel",
    "ExportedComponent",
    "ExportMetadata",
    "IORole",
    "TensorSpec",
    "ModelRunner",
    # quantizers
    "ExportQuantizer",
    "CalibrationSet",
    "PT2EQuantizer",
    "OnnxRuntimeQuantizer",
    "OnnxRuntimeStaticConfig",
    "OnnxRuntimeDynamicConfig",
    "NNCFOpenVINOQuantizer",
    "NNCFOnnxQuantizer",
    "NNCFTorchFXQuantizer",
    "NNCFQuantizationConfig",
    "NNCFWeightCompressionConfig",
    # errors
    "HfExportError",
    "ConfigError",
    "ExportError",
    "UnsupportedError",
    "ManifestError",
    "MissingPackageError",
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'hfexport' has no attribute {name!r}")
    module, _, attr = target.partition(":")
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
