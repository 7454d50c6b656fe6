"""Import path beside the spec's ``exporter_<backend>`` modules: ``hfexport.exporter_aoti`` (AotiExporter, AotiConfig)."""

from .backends.aoti.exporter import AotiExporter
from .configs import AotiConfig

__all__ = ["AotiExporter", "AotiConfig"]
