"""Spec import path: ``hfexport.exporter_executorch`` (ExecutorchExporter, ExecutorchConfig)."""

from .backends.executorch.exporter import ExecutorchExporter
from .configs import ExecutorchConfig

__all__ = ["ExecutorchExporter", "ExecutorchConfig"]
