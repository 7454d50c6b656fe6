"""The one validator of ``export.json``'s contents: every field's type and every path, before any file is touched.

Used for a local folder, for a staged manifest an interrupted save left, and for a manifest fetched from the Hub
before anything else is downloaded. Whatever the bytes are, the only exception it raises is :class:`ManifestError`,
listing every problem found (the first :data:`MAX_LISTED`, then how many more), each naming the field.
"""

from __future__ import annotations

import json
import re
import reprlib
from pathlib import PurePosixPath
from typing import Any

from .errors import ManifestError

__all__ = ["MANIFEST_NAME", "STAGING_NAME", "SCHEMA_VERSION", "MAX_LISTED", "parse_manifest", "check_manifest",
           "check_relative", "fail"]

MANIFEST_NAME = "export.json"
STAGING_NAME = ".hfexport-staging"
#: 2: each cache tensor's place in its cache (``TensorSpec.cache``) is recorded at trace time; version 1 exports,
#: which lack it, are refused rather than run with roles guessed from names
SCHEMA_VERSION = 2
MIN_SCHEMA_VERSION = 2
MAX_LISTED = 20
"""Problems listed in one error; a manifest with 300,000 bad entries still gives a message of a few lines."""

_SHA256 = re.compile(r"[0-9a-f]{64}")
_MAX_PATH = 1024


def check_relative(path: Any) -> str | None:
    """Why ``path`` is not a safe relative path inside an export folder (None where it is)."""
    if not isinstance(path, str) or not path:
        return f"file path {_short(path)} is not a non-empty string"
    if len(path) > _MAX_PATH:
        return f"file path {_short(path)} is longer than {_MAX_PATH} characters"
    if "\\" in path or "\x00" in path:
        return f"file path {_short(path)} contains a backslash or NUL"
    pure = PurePosixPath(path)
    if pure.is_absolute() or (len(path) > 1 and path[1] == ":"):
        return f"file path {_short(path)} is absolute"
    if ".." in pure.parts:
        return f"file path {_short(path)} leaves the export directory ('..')"
    if pure.parts and pure.parts[0] == STAGING_NAME:
        return f"file path {_short(path)} is inside the staging folder {STAGING_NAME!r}"
    if path.endswith("/") or not pure.parts or pure.parts[-1] in (".", ""):
        return f"file path {_short(path)} names a folder, not a file"
    return None


def parse_manifest(text: str, where: str, name: str = MANIFEST_NAME) -> dict[str, Any]:
    """Parse and check a manifest's text; returns the manifest (a dict whose every field has the documented type).

    Raises:
        ManifestError: the problems, each naming the field and what is wrong.
    """
    manifest, problems = check_manifest(text, where, name)
    if problems:
        fail(where, problems)
    return manifest


def check_manifest(text: str, where: str, name: str = MANIFEST_NAME) -> tuple[dict[str, Any], list[str]]:
    """Parse and check a manifest's text: ``(manifest, problems)``, the manifest's ``files`` reduced to the
    well-formed entries (so a caller can check those on disk too and report every problem at once).

    Args:
        text: The file's contents.
        where: The directory or repo id, for the error.
        name: How to call the file in messages (``export.json``, ``.hfexport-staging/export.json``).

    Raises:
        ManifestError: the problems, each naming the field and what is wrong.
    """
    try:
        manifest = json.loads(text)
    except RecursionError:
        fail(where, [f"{name} is nested too deeply to be a manifest"])
    except ValueError as e:
        fail(where, [f"{name} is not valid JSON: {str(e)[:200]}"])
    if not isinstance(manifest, dict):
        fail(where, [f"{name} must hold a JSON object, not {_kind(manifest)}"])
    problems: list[str] = []
    version = manifest.get("schema_version")
    if type(version) is not int or not MIN_SCHEMA_VERSION <= version <= SCHEMA_VERSION:
        fix = ("re-export the model with this hfexport: an earlier one did not record the cache's leaves"
               if type(version) is int and version < MIN_SCHEMA_VERSION else "upgrade hfexport for newer exports")
        problems.append(f"{name}: schema_version {_short(version)} is not supported (this hfexport reads "
                        f"{MIN_SCHEMA_VERSION} to {SCHEMA_VERSION}; {fix})")
    for key in ("export_format", "format", "hfexport_version"):
        if key in manifest and not isinstance(manifest[key], str) or (key == "export_format" and key not in manifest):
            problems.append(f"{name}: '{key}' must be a string, got {_kind(manifest.get(key))}")
    good = _files(manifest.get("files"), name, problems)
    listed = {entry["path"] for entry in good}
    manifest["files"] = good
    _components(manifest.get("components"), listed, name, problems)
    _configs(manifest.get("configs", {}), listed, name, problems)
    return manifest, problems


def _files(files: Any, name: str, problems: list[str]) -> list[dict]:
    """The well-formed entries of ``files``; a problem for each other one."""
    if not isinstance(files, list):
        problems.append(f"{name}: 'files' must be a list of {{path, size, sha256}} objects, got {_kind(files)}")
        return []
    listed: set[str] = set()
    good: list[dict] = []
    for index, entry in enumerate(files):
        field = f"{name}: files[{index}]"
        if not isinstance(entry, dict):
            problems.append(f"{field} must be an object with path, size and sha256, got {_kind(entry)}")
            continue
        path = entry.get("path")
        bad = check_relative(path)
        if bad:
            problems.append(f"{field}: {bad}")
            continue
        if path in listed:
            problems.append(f"{field}: {path!r} is listed twice")
            continue
        listed.add(path)
        size, sha = entry.get("size"), entry.get("sha256")
        if type(size) is not int or size < 0:
            problems.append(f"{field} ({path}): size must be a non-negative integer, got {_short(size)}")
        elif not isinstance(sha, str) or not _SHA256.fullmatch(sha):
            problems.append(f"{field} ({path}): sha256 must be 64 lowercase hex digits, got {_short(sha)}")
        else:
            good.append(entry)
    return good


def _components(components: Any, listed: set[str], name: str, problems: list[str]) -> None:
    if not isinstance(components, dict) or not components:
        problems.append(f"{name}: 'components' must be a non-empty object of name -> {{program, files, metadata}}, "
                        f"got {_kind(components)}")
        return
    for component, entry in components.items():
        field = f"{name}: component {_short(component)}"
        if not isinstance(entry, dict):
            problems.append(f"{field} must be an object, got {_kind(entry)}")
            continue
        files = entry.get("files")
        if not isinstance(files, list) or not files or not all(isinstance(f, str) for f in files):
            problems.append(f"{field}: 'files' must be a non-empty list of file paths, got {_kind(files)}")
            files = []
        for path in files:
            if path not in listed:
                problems.append(f"{field}: file {_short(path)} is not listed in 'files'")
        program = entry.get("program", files[0] if files else None)
        if not isinstance(program, str) or program not in files:
            problems.append(f"{field}: 'program' {_short(program)} must be one of its own files")
        if not isinstance(entry.get("metadata"), dict):
            problems.append(f"{field}: 'metadata' must be an object, got {_kind(entry.get('metadata'))}")


def _configs(configs: Any, listed: set[str], name: str, problems: list[str]) -> None:
    if not isinstance(configs, dict):
        problems.append(f"{name}: 'configs' must be an object of name -> file path, got {_kind(configs)}")
        return
    for key, path in configs.items():
        if not isinstance(path, str) or path not in listed:
            problems.append(f"{name}: config {_short(key)}: file {_short(path)} is not listed in 'files'")
        elif not path.endswith(".json"):
            problems.append(f"{name}: config {_short(key)}: file {path!r} is not a .json file")


def fail(where: str, problems: list[str]) -> None:
    """Raise the :class:`ManifestError` for ``problems`` (the first :data:`MAX_LISTED` of them)."""
    total = len(problems)
    if total > MAX_LISTED:
        problems = [*problems[:MAX_LISTED], f"... and {total - MAX_LISTED} more problems"]
    raise ManifestError(where, problems, total=total)


def _kind(value: Any) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {_short(value)}"


_REPR = reprlib.Repr()  # bounded: a field may hold a 300k-entry list
_REPR.maxlevel, _REPR.maxdict, _REPR.maxlist, _REPR.maxtuple, _REPR.maxset = 3, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 80, 80, 40


def _short(value: Any, limit: int = 80) -> str:
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
