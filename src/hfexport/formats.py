"""``ExportFormat``: the names of the export formats, one per backend (the bottom layer: imports nothing of ours)."""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["ExportFormat", "parse_format"]


class ExportFormat(str, enum.Enum):
    """The export formats (one per backend)."""

    DYNAMO = "dynamo"
    ONNX = "onnx"
    EXECUTORCH = "executorch"
    OPENVINO = "openvino"
    AOTI = "aoti"

    def __str__(self) -> str:
        return self.value


def parse_format(value: Any) -> ExportFormat | str:
    """An :class:`ExportFormat` for a built-in format name, else the string (a registered custom backend)."""
    if isinstance(value, ExportFormat):
        return value
    try:
        return ExportFormat(str(value).lower())
    except ValueError:
        return str(value)
