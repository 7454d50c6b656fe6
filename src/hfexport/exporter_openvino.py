"""Spec import path: ``hfexport.exporter_openvino`` (OpenVINOExporter, OpenVINOConfig)."""

from .backends.openvino.exporter import OpenVINOExporter
from .configs import OpenVINOConfig

__all__ = ["OpenVINOExporter", "OpenVINOConfig"]
