"""``export.json``: the manifest of a saved export, written atomically and checked before anything is loaded.

Layout of a saved export directory::

    export.json              schema_version, export_format, files (path, size, sha256), components, configs
    config.json              the model config
    generation_config.json   (generative models)
    model.pt2 / decode.onnx + decode.onnx.data / ...   the programs, as each backend writes them

Saving stages every file in ``.hfexport-staging/`` and only then moves them in, the manifest last. If a save is
killed while moving, the staged manifest is complete and names where every file is, so loading (and the next save)
finishes the move: nothing is lost. Loading validates the whole manifest first and reports every problem at once:
absolute paths, ``..``, links that leave the directory, missing files, size and sha256 mismatches. (In a
``huggingface_hub`` cache snapshot, links into that repo's own ``blobs/`` are how the files are stored: allowed.)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import ManifestError

__all__ = ["MANIFEST_NAME", "SCHEMA_VERSION", "write_export", "read_manifest", "sha256_file"]

MANIFEST_NAME = "export.json"
STAGING_NAME = ".hfexport-staging"
SCHEMA_VERSION = 1
_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finish_pending(directory: Path) -> None:
    """Complete (or discard) a save that was interrupted."""
    staging = directory / STAGING_NAME
    if not staging.is_dir():
        return
    staged_manifest = staging / MANIFEST_NAME
    if staged_manifest.is_file():
        # a staged manifest may not be ours (a copied or downloaded directory): check every path before moving any
        try:
            manifest = json.loads(staged_manifest.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ManifestError(str(directory), [f"{STAGING_NAME}/{MANIFEST_NAME} is not valid JSON: {e}"]) from None
        entries = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(entries, list):
            raise ManifestError(str(directory), [f"{STAGING_NAME}/{MANIFEST_NAME} has no 'files' list"])
        problems = [
            f"{STAGING_NAME}/{MANIFEST_NAME}: {bad}"
            for bad in (_check_relative(e.get("path") if isinstance(e, dict) else e) for e in entries)
            if bad
        ]
        if problems:
            raise ManifestError(str(directory), problems)
        for entry in entries:
            src = staging / entry["path"]
            if src.is_file():
                (directory / entry["path"]).parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, directory / entry["path"])
        os.replace(staged_manifest, directory / MANIFEST_NAME)
    shutil.rmtree(staging, ignore_errors=True)


def write_export(
    directory: str | Path,
    write_files: Callable[[Path], dict[str, Any]],
) -> dict[str, Any]:
    """Write an export atomically.

    Args:
        directory: Target directory (created if missing; other files in it are left alone).
        write_files: Called with the staging directory; writes every file there and returns the manifest body
            (everything except ``files``, which is computed here from what was written).

    Returns:
        The manifest that was written.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    _finish_pending(directory)
    staging = directory / STAGING_NAME
    staging.mkdir()
    try:
        body = write_files(staging)
        files = []
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            _fsync_file(path)
            rel = path.relative_to(staging).as_posix()
            files.append({"path": rel, "size": path.stat().st_size, "sha256": sha256_file(path)})
        manifest = {"schema_version": SCHEMA_VERSION, **body, "files": files}
        tmp = staging / (MANIFEST_NAME + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False))
        _fsync_file(tmp)
        os.replace(tmp, staging / MANIFEST_NAME)  # from here on the save is committed
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _finish_pending(directory)
    return manifest


def _check_relative(path: Any) -> str | None:
    if not isinstance(path, str) or not path:
        return f"file path {path!r} is not a non-empty string"
    if "\\" in path or "\x00" in path:
        return f"file path {path!r} contains a backslash or NUL"
    pure = PurePosixPath(path)
    if pure.is_absolute() or (len(path) > 1 and path[1] == ":"):
        return f"file path {path!r} is absolute"
    if ".." in pure.parts:
        return f"file path {path!r} leaves the export directory ('..')"
    if pure.parts and pure.parts[0] == STAGING_NAME:
        return f"file path {path!r} is inside the staging folder {STAGING_NAME!r}"
    return None


def read_manifest(directory: str | Path, verify: bool = True) -> tuple[dict[str, Any], Path]:
    """Read and validate the manifest of an export directory; returns ``(manifest, root)``.

    Raises:
        ManifestError: listing every problem (missing manifest, bad JSON, unsupported schema, unsafe paths, links
            leaving the directory, missing files, size or sha256 mismatches, components naming unlisted files).
    """
    root = Path(directory)
    staging = root / STAGING_NAME
    if (staging / MANIFEST_NAME).is_file():
        # an interrupted save whose commit point was reached: finish it, or read the files where they are
        try:
            _finish_pending(root)
        except OSError:
            return _read_from(root, staging, verify)
    return _read_from(root, None, verify)


def _read_from(root: Path, staging: Path | None, verify: bool) -> tuple[dict[str, Any], Path]:
    manifest_path = (staging or root) / MANIFEST_NAME
    if not manifest_path.is_file():
        raise ManifestError(str(root), [f"no {MANIFEST_NAME} (this is not an hfexport export directory)"])
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ManifestError(str(root), [f"{MANIFEST_NAME} is not valid JSON: {e}"]) from None
    problems: list[str] = []
    if not isinstance(manifest, dict):
        raise ManifestError(str(root), [f"{MANIFEST_NAME} must hold a JSON object"])
    version = manifest.get("schema_version")
    if not isinstance(version, int) or version > SCHEMA_VERSION or version < 1:
        problems.append(f"schema_version {version!r} is not supported (this hfexport reads <= {SCHEMA_VERSION})")
    for key, kind in (("export_format", str), ("components", dict), ("files", list)):
        if not isinstance(manifest.get(key), kind):
            problems.append(f"'{key}' is missing or not a {kind.__name__}")
    if problems:
        raise ManifestError(str(root), problems)

    resolved_root = root.resolve()
    # a Hub cache snapshot holds links into its repo's blobs/: those stay inside the downloaded repo
    allowed_roots = [resolved_root, *_hub_blobs(root)]
    listed: dict[str, dict] = {}
    for entry in manifest["files"]:
        if not isinstance(entry, dict):
            problems.append(f"file entry {entry!r} is not an object")
            continue
        path = entry.get("path")
        bad = _check_relative(path)
        if bad:
            problems.append(bad)
            continue
        listed[path] = entry
        location = _locate(root, staging, path)
        if location is None:
            problems.append(f"{path}: missing")
            continue
        target = location.resolve()
        if not any(allowed in target.parents for allowed in allowed_roots):
            problems.append(f"{path}: is a link that leaves the export directory (-> {target})")
            continue
        if not location.is_file():
            problems.append(f"{path}: not a regular file")
            continue
        if verify:
            size = location.stat().st_size
            if size != entry.get("size"):
                problems.append(f"{path}: size {size} != {entry.get('size')} recorded in the manifest")
            elif sha256_file(location) != entry.get("sha256"):
                problems.append(f"{path}: sha256 does not match the manifest (corrupt or modified)")
    for name, component in manifest["components"].items():
        if not isinstance(component, dict) or not isinstance(component.get("files"), list):
            problems.append(f"component {name!r}: missing its 'files' list")
            continue
        for path in component["files"]:
            if path not in listed:
                problems.append(f"component {name!r}: file {path!r} is not listed in 'files'")
        if not isinstance(component.get("metadata"), dict):
            problems.append(f"component {name!r}: missing its metadata")
    for key, path in (manifest.get("configs") or {}).items():
        if path not in listed:
            problems.append(f"config {key!r}: file {path!r} is not listed in 'files'")
    if problems:
        raise ManifestError(str(root), problems)
    manifest["_locations"] = {path: str(_locate(root, staging, path)) for path in listed}
    return manifest, root


_COMMIT = re.compile(r"[0-9a-f]{40}")


def _hub_blobs(root: Path) -> list[Path]:
    """``[blobs]`` when ``root`` is (in) a ``huggingface_hub`` cache snapshot, ``<repo>/snapshots/<commit>/...``."""
    for snapshot in (absolute := Path(os.path.abspath(root)), *absolute.parents):
        repo = snapshot.parent.parent
        if (
            _COMMIT.fullmatch(snapshot.name)
            and snapshot.parent.name == "snapshots"
            and repo.name.startswith(("models--", "datasets--", "spaces--"))
            and (repo / "blobs").is_dir()
        ):
            return [(repo / "blobs").resolve()]
    return []


def _locate(root: Path, staging: Path | None, path: str) -> Path | None:
    for base in (staging, root):
        if base is not None and os.path.lexists(base / path):
            return base / path
    return None
