"""Which exporter, config and runner serve each export format.

Built-in backends are named by dotted path and imported on first use, so ``import hfexport`` loads no ONNX,
ExecuTorch or OpenVINO module. :func:`register_backend` adds (or replaces) a backend at run time.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Mapping
from typing import Any

from .configs import BUILTIN_CONFIGS, ExportConfigMixin, ExportFormat, parse_format
from .errors import ConfigError

# the exporter and runner classes (HfExporter and ModelRunner subclasses) are never imported here: they sit above
# the registry, which reaches the built-in ones by dotted path

__all__ = ["register_backend", "AutoHfExporter", "AutoExportConfig", "exporter_class_for", "runner_class_for",
           "config_class_for"]

_BUILTIN: dict[ExportFormat, tuple[str, str]] = {
    ExportFormat.DYNAMO: ("hfexport.backends.dynamo.exporter:DynamoExporter", "hfexport.backends.dynamo.runner:DynamoRunner"),
    ExportFormat.ONNX: ("hfexport.backends.onnx.exporter:OnnxExporter", "hfexport.backends.onnx.runner:OnnxRunner"),
    ExportFormat.EXECUTORCH: (
        "hfexport.backends.executorch.exporter:ExecutorchExporter",
        "hfexport.backends.executorch.runner:ExecutorchRunner",
    ),
    ExportFormat.OPENVINO: (
        "hfexport.backends.openvino.exporter:OpenVINOExporter",
        "hfexport.backends.openvino.runner:OpenVINORunner",
    ),
    ExportFormat.AOTI: ("hfexport.backends.aoti.exporter:AotiExporter", "hfexport.backends.aoti.runner:AotiRunner"),
}

_lock = threading.Lock()
_exporters: dict[Any, type] = {}
_runners: dict[Any, type] = {}
_configs: dict[Any, type[ExportConfigMixin]] = dict(BUILTIN_CONFIGS)


def _resolve(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def _resolve_builtin(fmt: ExportFormat, which: int) -> type:
    path = _BUILTIN[fmt][which]
    try:
        return _resolve(path)
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("hfexport."):
            from .errors import UnsupportedError

            import importlib.util

            available = [str(f) for f in _BUILTIN if importlib.util.find_spec(f"hfexport.backends.{f}") is not None]
            raise UnsupportedError(
                f"the {str(fmt)!r} backend is not part of this hfexport release yet ({path} is missing); "
                f"available now: {', '.join(available)}"
            ) from None
        raise


def known_formats() -> list[str]:
    return sorted({str(f) for f in (*_BUILTIN, *_exporters, *_configs)})


def register_backend(exporter: type, runner: type | None = None) -> type:
    """Register an exporter under its ``export_format`` with its ``config_class``, and the runner of its exports.

    Usable as a class decorator. A later registration for the same format replaces the earlier one.

    Example:
        >>> @register_backend
        ... class MyExporter(HfExporter):
        ...     export_format = "my-format"
        ...     config_class = MyConfig
    """
    fmt = parse_format(getattr(exporter, "export_format", None))
    config_class = getattr(exporter, "config_class", None)
    problems = []
    if not fmt or fmt == "None":
        problems.append(f"{exporter.__name__}.export_format is not set")
    if not (isinstance(config_class, type) and issubclass(config_class, ExportConfigMixin)):
        problems.append(f"{exporter.__name__}.config_class must be an ExportConfigMixin subclass")
    else:
        # AutoExportConfig dispatches on the config's own export_format: it must name this backend
        field = getattr(config_class, "__dataclass_fields__", {}).get("export_format")
        config_fmt = parse_format(field.default) if field is not None else None
        if config_fmt != fmt:
            problems.append(
                f"{config_class.__name__} needs an export_format field defaulting to {str(fmt)!r} "
                f"(found {'no field' if field is None else repr(str(config_fmt))})"
            )
    if problems:
        raise ConfigError("backend registration", problems)
    with _lock:
        _exporters[fmt] = exporter
        _configs[fmt] = config_class
        if runner is not None:
            _runners[fmt] = runner
    return exporter


def exporter_class_for(export_format: ExportFormat | str) -> type:
    fmt = parse_format(export_format)
    with _lock:
        if fmt not in _exporters and fmt in _BUILTIN:
            _exporters[fmt] = _resolve_builtin(fmt, 0)
        cls = _exporters.get(fmt)
    if cls is None:
        raise ConfigError("export format", [f"no backend registered for {str(fmt)!r}; known: {known_formats()}"])
    return cls


def runner_class_for(export_format: ExportFormat | str) -> type:
    fmt = parse_format(export_format)
    with _lock:
        if fmt not in _runners and fmt in _BUILTIN:
            _runners[fmt] = _resolve_builtin(fmt, 1)
        cls = _runners.get(fmt)
    if cls is None:
        raise ConfigError("export format", [f"no runner registered for {str(fmt)!r}; pass runner= to register_backend"])
    return cls


def config_class_for(export_format: ExportFormat | str) -> type[ExportConfigMixin] | None:
    return _configs.get(parse_format(export_format))


class AutoHfExporter:
    """Instantiates the exporter that serves a config (or a config dict).

    Example:
        >>> exporter = AutoHfExporter.from_config({"export_format": "dynamo", "dynamic": True})
        >>> type(exporter).__name__
        'DynamoExporter'
    """

    def __init__(self) -> None:
        raise OSError("AutoHfExporter is not meant to be instantiated; use AutoHfExporter.from_config(...)")

    @staticmethod
    def from_config(config: ExportConfigMixin | dict[str, Any]) -> Any:
        if isinstance(config, dict):
            config = AutoExportConfig.from_dict(config)
        if not isinstance(config, ExportConfigMixin):
            raise ConfigError("export config", [f"expected an export config or a dict, got {type(config).__name__}"])
        return exporter_class_for(config.export_format)()


class AutoExportConfig:
    """Builds the right config class from a dict, dispatching on its ``export_format``.

    Example:
        >>> config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})
        >>> type(config).__name__
        'OnnxConfig'
    """

    def __init__(self) -> None:
        raise OSError("AutoExportConfig is not meant to be instantiated; use AutoExportConfig.from_dict(...)")

    @staticmethod
    def from_dict(config_dict: Mapping[str, Any]) -> ExportConfigMixin:
        if not isinstance(config_dict, Mapping):
            raise ConfigError("export config", [f"expected a dict, got {type(config_dict).__name__}"])
        if "export_format" not in config_dict:
            raise ConfigError("export config", [f"missing 'export_format'; one of {known_formats()}"])
        fmt = parse_format(config_dict["export_format"])
        cls = config_class_for(fmt)
        if cls is None:
            raise ConfigError(
                "export config", [f"export_format: unknown format {str(fmt)!r}; one of {known_formats()}"]
            )
        return cls.from_dict(config_dict)
