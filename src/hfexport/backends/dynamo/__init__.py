"""The torch.export backend: ``.pt2`` programs, run by ``ExportedProgram.module()``."""

from .exporter import DynamoExporter
from .runner import DynamoRunner

__all__ = ["DynamoExporter", "DynamoRunner"]
