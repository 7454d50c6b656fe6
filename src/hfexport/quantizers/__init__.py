"""Post-training quantizers applied during export."""

from .base import CalibrationSet, ExportQuantizer

__all__ = ["CalibrationSet", "ExportQuantizer"]
