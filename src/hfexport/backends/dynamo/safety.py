"""Load ``.pt2`` archives without running anything the file chooses.

What ``torch.export.load`` (torch 2.13, ``torch/export/pt2_archive/_package.py`` and ``torch/_export/serde``) does
with each member of the archive, and what is checked here first:

| member | what torch does with it | checked |
|---|---|---|
| ``data/weights/*``, ``data/constants/tensor_*`` with ``use_pickle: true`` | ``torch.load(weights_only=False)`` | must load with ``weights_only=True`` |
| ``data/constants/custom_obj_*`` / ``opaque_obj_*`` | TorchScript unpickle / ``pickle.loads`` | refused: hfexport writes none |
| ``data/weights/*`` raw payloads | read as storage; an empty record becomes zeros | record size covers the tensor's view |
| ``data/sample_inputs/*.pt`` | ``weights_only=True``, then retried with ``weights_only=False`` | must load with ``weights_only=True`` |
| ``data/aotinductor/*``, ``data/executorch/*``, legacy ``*.pt`` | shared libraries loaded, pickles | refused: not a member hfexport writes |
| ``models/model.json`` | symbolic sizes to ``sympy.sympify`` (eval), guards compiled and run, node targets by ``getattr`` | :mod:`.graph_safety` |
| ``extra/*`` | read as text | allowed |

Anything else in the archive is refused: a member torch may learn to read later is not read unchecked.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from pathlib import Path
from typing import Any

import torch

from ...errors import ManifestError
from ...pytrees import serialization_safe_classes
from .graph_safety import graph_problems

__all__ = ["safe_globals", "check_archive", "example_inputs_are_safe"]

_FIXED = {"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id",
          "models/model.json", "data/sample_inputs/model.pt"}
_CONFIGS = {"data/weights/model_weights_config.json": ("data/weights/", re.compile(r"weight_\d+")),
            "data/constants/model_constants_config.json": ("data/constants/", re.compile(r"tensor_\d+"))}
_EXTRA = re.compile(r"extra/[^/]+")


def safe_globals() -> list[type]:
    """Classes a saved program's sample inputs may hold (see :func:`serialization_safe_classes`)."""
    return serialization_safe_classes()


def check_archive(path: Path, allowed: list[type]) -> None:
    """Refuse a ``.pt2`` whose members would make ``torch.export.load`` or the loaded module run code, read outside
    the archive, or fill a weight with zeros; every problem is listed (see the module docstring)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ManifestError(str(path), [f"{path.name}: not a .pt2 archive ({e})"]) from None
    with archive:
        problems = _archive_problems(path.name, archive, allowed)
    if problems:
        raise ManifestError(str(path), problems)


def _archive_problems(name: str, archive: zipfile.ZipFile, allowed: list[type]) -> list[str]:
    infos = archive.infolist()
    roots = {info.filename.split("/", 1)[0] for info in infos}
    if len(roots) != 1 or any("/" not in info.filename for info in infos):
        return [f"{name}: the archive's members are not under one root folder, as torch.export.save writes them"]
    root = next(iter(roots)) + "/"
    members = {info.filename[len(root):]: info for info in infos if not info.is_dir()}
    problems: list[str] = []
    payloads: set[str] = set()
    for config_name, (folder, pattern) in _CONFIGS.items():
        if config_name not in members:
            problems.append(f"{name}: {config_name} is missing")
            continue
        config = _json(archive, members[config_name], name, problems)
        if config is not None:
            payloads |= _payload_problems(name, archive, members, config_name, config, folder, pattern, allowed,
                                          problems)
    for member in members:
        if member not in _FIXED and member not in _CONFIGS and member not in payloads and not _EXTRA.fullmatch(member):
            problems.append(f"{name}: member {member!r} is not one hfexport writes (torch could load code or pickles "
                            "from it)")
    if "models/model.json" not in members:
        problems.append(f"{name}: models/model.json (the graph) is missing")
    else:
        graph = _json(archive, members["models/model.json"], name, problems)
        if graph is not None:
            problems.extend(f"{name}: models/model.json: {p}" for p in graph_problems(graph))
    sample = members.get("data/sample_inputs/model.pt")
    if sample is not None and sample.file_size:  # torch reads an empty member as "no sample inputs"
        why = _unsafe_pickle(archive.read(sample), allowed)
        if why:
            problems.append(f"{name}: data/sample_inputs/model.pt holds objects outside the allowed types ({why}); a "
                            "full unpickle could run code")
    return problems


def _json(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, problems: list[str]) -> Any:
    try:
        return json.loads(archive.read(info))
    except (ValueError, RecursionError, UnicodeDecodeError, zipfile.BadZipFile, OSError) as e:
        problems.append(f"{name}: {info.filename} is not readable JSON ({type(e).__name__})")
        return None


def _payload_problems(name: str, archive: zipfile.ZipFile, members: dict[str, zipfile.ZipInfo], config_name: str,
                      config: Any, folder: str, pattern: re.Pattern, allowed: list[type],
                      problems: list[str]) -> set[str]:
    """Check each payload a weights/constants config names; returns the members it names."""
    entries = config.get("config") if isinstance(config, dict) else None
    if not isinstance(entries, dict):
        problems.append(f"{name}: {config_name} has no 'config' mapping")
        return set()
    named: set[str] = set()
    needed: dict[str, int] = {}
    for fqn, meta in entries.items():
        where = f"{name}: {config_name} entry {str(fqn)[:80]!r}"
        path_name = meta.get("path_name") if isinstance(meta, dict) else None
        if not isinstance(path_name, str) or not pattern.fullmatch(path_name):
            problems.append(f"{where}: payload {path_name!r} is not a plain {pattern.pattern} tensor file (custom or "
                            "opaque objects are unpickled by torch; hfexport writes none)")
            continue
        member = folder + path_name
        named.add(member)
        info = members.get(member)
        if info is None:
            problems.append(f"{where}: {member} is missing")
            continue
        if meta.get("use_pickle"):
            why = _unsafe_pickle(archive.read(info), allowed)
            if why:
                problems.append(f"{where}: {member} is a pickle torch would load with weights_only=False, and it "
                                f"does not load with weights_only=True ({why})")
            continue
        nbytes = _view_bytes(meta.get("tensor_meta"))
        if nbytes is None:
            problems.append(f"{where}: tensor_meta is not a static tensor description")
            continue
        needed[member] = max(needed.get(member, 0), nbytes)
    for member, nbytes in needed.items():
        size = members[member].file_size
        if size < nbytes:
            problems.append(f"{name}: {member} holds {size} bytes, its tensors need {nbytes} (truncated or emptied; "
                            "torch would read an empty one as zeros)")
    return named


def _view_bytes(meta: Any) -> int | None:
    """Bytes of storage an ``as_strided`` view of ``meta`` reads, or None where it is not plain static data."""
    try:
        dtype = _DTYPE_SIZES[meta["dtype"]]
        sizes = [_static(s) for s in meta["sizes"]]
        strides = [_static(s) for s in meta["strides"]]
        offset = _static(meta["storage_offset"])
    except (KeyError, TypeError, ValueError):
        return None
    if len(sizes) != len(strides) or any(s < 0 for s in (*sizes, *strides, offset)):
        return None
    if 0 in sizes:
        return 0
    return (offset + sum((size - 1) * stride for size, stride in zip(sizes, strides)) + 1) * dtype


def _static(value: Any) -> int:
    if isinstance(value, dict) and set(value) == {"as_int"} and type(value["as_int"]) is int:
        return value["as_int"]
    raise ValueError("not a static size")


def _dtype_sizes() -> dict[int, int]:
    from torch._export.serde.schema import ScalarType
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    return {int(code.value if isinstance(code, ScalarType) else code): dtype.itemsize
            for code, dtype in _SERIALIZE_TO_TORCH_DTYPE.items()}


_DTYPE_SIZES = _dtype_sizes()


def _unsafe_pickle(data: bytes, allowed: list[type]) -> str | None:
    """Why ``data`` does not load with ``torch.load(weights_only=True)`` (None where it does)."""
    try:
        with torch.serialization.safe_globals(allowed):
            torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - every failure is a refusal
        lines = str(e).strip().splitlines() or [type(e).__name__]
        return next((ln.strip() for ln in lines if "Unsupported global" in ln), lines[-1])[:300]
    return None


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
