"""Spec import path: ``hfexport.exporter_onnx`` (OnnxExporter, OnnxConfig)."""

from .backends.onnx.exporter import OnnxExporter
from .configs import OnnxConfig

__all__ = ["OnnxExporter", "OnnxConfig"]
