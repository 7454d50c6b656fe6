"""hfexport: export Hugging Face transformers models to torch.export, ONNX, ExecuTorch and OpenVINO, and run them.

``import hfexport`` loads no torch: each name is imported the first time it is used (torch and transformers with the
first config, exporter or export; a backend and its runtime, onnxruntime, executorch or openvino, with its own
names).

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
from .errors import ConfigError, ExportError, HfExportError, ManifestError, MissingPackageError, UnsupportedError
from .formats import ExportFormat
from .workarounds.torchvision_ops import install_import_hook as _install_torchvision_hook

# torchvision importable (timm's models, transformers' fast image processors) where its C++ extension does not load:
# the workaround torchvision-ops-without-extension, applied when torchvision is first imported
_install_torchvision_hook()

# name -> "module:attribute", imported on first access: `import hfexport` (and `hfexport --help`) loads no torch;
# the backends and their runtimes stay unloaded until one of their names is used
_LAZY = {
    **{name: f"hfexport.configs:{name}" for name in (
        "AotiConfig", "DynamoConfig", "ExecutorchConfig", "ExportConfigMixin", "OnnxConfig", "OpenVINOConfig")},
    **{name: f"hfexport.exported:{name}" for name in ("ExportedComponent", "ExportedModel")},
    "HfExporter": "hfexport.exporter:HfExporter",
    **{name: f"hfexport.metadata:{name}" for name in ("ExportMetadata", "IORole", "TensorSpec")},
    **{name: f"hfexport.quantizers:{name}" for name in (
        "CalibrationSet", "ExportQuantizer", "NNCFOnnxQuantizer", "NNCFOpenVINOQuantizer", "NNCFQuantizationConfig",
        "NNCFTorchFXQuantizer", "NNCFWeightCompressionConfig", "OnnxRuntimeDynamicConfig", "OnnxRuntimeQuantizer",
        "OnnxRuntimeStaticConfig", "OnnxRuntimeWeightOnlyConfig", "PT2EQuantizer", "TorchAOQuantizer",
        "GroupWeightOpenVINOQuantizer", "GroupWeightConfig")},
    **{name: f"hfexport.registry:{name}" for name in ("AutoExportConfig", "AutoHfExporter", "register_backend")},
    "ModelRunner": "hfexport.runner:ModelRunner",
    "validate": "hfexport.validation:validate",
    "DynamoExporter": "hfexport.backends.dynamo.exporter:DynamoExporter",
    "OnnxExporter": "hfexport.backends.onnx.exporter:OnnxExporter",
    "ExecutorchExporter": "hfexport.backends.executorch.exporter:ExecutorchExporter",
    "OpenVINOExporter": "hfexport.backends.openvino.exporter:OpenVINOExporter",
    "AotiExporter": "hfexport.backends.aoti.exporter:AotiExporter",
}

__all__ = [
    # configs
    "ExportFormat",
    "ExportConfigMixin",
    "DynamoConfig",
    "OnnxConfig",
    "ExecutorchConfig",
    "OpenVINOConfig",
    "AotiConfig",
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
    "validate",
    # quantizers
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
