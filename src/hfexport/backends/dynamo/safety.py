"""Load ``.pt2`` archives without ever running a full (code-executing) unpickle."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import torch

from ...capture.caches import serialization_safe_classes
from ...errors import ManifestError

__all__ = ["safe_globals", "check_archive_pickles", "example_inputs_are_safe"]


def safe_globals() -> list[type]:
    """Classes a saved program's sample inputs may hold (see :func:`serialization_safe_classes`)."""
    return serialization_safe_classes()


def check_archive_pickles(path: Path, allowed: list[type]) -> None:
    """Unpickle every ``.pt`` member of a ``.pt2`` archive with ``weights_only=True``; refuse the file otherwise."""
    problems = []
    try:
        archive = zipfile.ZipFile(path)
    except zipfile.BadZipFile as e:
        raise ManifestError(str(path), [f"not a .pt2 archive: {e}"]) from None
    with archive, torch.serialization.safe_globals(allowed):
        for info in archive.infolist():
            if not info.filename.endswith(".pt") or info.file_size == 0:
                continue  # torch.export reads an empty member as "no sample inputs" without unpickling
            try:
                torch.load(io.BytesIO(archive.read(info)), weights_only=True)
            except Exception as e:  # noqa: BLE001 - every failure is a refusal
                lines = str(e).strip().splitlines() or [type(e).__name__]
                first = next((ln.strip() for ln in lines if "Unsupported global" in ln), lines[-1])[:300]
                problems.append(f"{info.filename}: holds objects outside the allowed types ({first})")
    if problems:
        raise ManifestError(str(path), problems + ["refusing to unpickle it: a full unpickle could run code"])


def example_inputs_are_safe(program: torch.export.ExportedProgram, allowed: list[type]) -> bool:
    """Whether the program's sample inputs survive a ``weights_only`` round trip (so they can be saved)."""
    example = program.example_inputs
    if example is None:
        return True
    buffer = io.BytesIO()
    try:
        torch.save(example, buffer)
        buffer.seek(0)
        with torch.serialization.safe_globals(allowed):
            torch.load(buffer, weights_only=True)
    except Exception:  # noqa: BLE001 - any failure means "not loadable safely"
        return False
    return True
