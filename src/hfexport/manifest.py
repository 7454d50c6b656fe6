"""``export.json``: the manifest of a saved export, written atomically and checked before anything is loaded.

Layout of a saved export directory::

    export.json              schema_version, export_format, files (path, size, sha256), components, configs
    config.json              the model config
    generation_config.json   (generative models)
    model.pt2 / decode.onnx + decode.onnx.data / ...   the programs, as each backend writes them

Saving stages every file in ``.hfexport-staging/`` and only then moves them in, the manifest last. If a save is
killed while moving, the staged manifest is complete and names where every file is, so loading (and the next save)
finishes the move: nothing is lost. That recovery never follows a link: a staging folder, a staged file or a folder
on the way that is a symbolic link is left alone (a link is removed, never its target), so it cannot move files of
another folder. Loading validates the whole manifest first (:mod:`.manifest_schema`) and reports every problem at
once: wrong types, absolute paths, ``..``, links that leave the directory, missing files, size and sha256 mismatches.
(In a ``huggingface_hub`` cache snapshot, links into that repo's own ``blobs/`` are how the files are stored:
allowed.)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import ManifestError
from .manifest_schema import (MANIFEST_NAME, SCHEMA_VERSION, STAGING_NAME, check_manifest, check_relative, fail,
                              parse_manifest)

__all__ = ["MANIFEST_NAME", "SCHEMA_VERSION", "STAGING_NAME", "write_export", "read_manifest", "sha256_file",
           "parse_manifest", "listed_files", "reference_problem"]

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


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _is_real_file(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _real_parents(directory: Path, relative: str) -> bool:
    """Whether every folder between ``directory`` and ``relative``'s parent is a real folder (or missing), never a
    link: a move into ``sub/file`` through a linked ``sub`` would land outside."""
    current = directory
    for part in Path(relative).parts[:-1]:
        current = current / part
        if os.path.lexists(current) and not _is_real_dir(current):
            return False
    return True


def _discard_staging(staging: Path) -> None:
    """Remove a staging folder; a link is removed itself, never what it points to."""
    if os.path.islink(staging) or (os.path.lexists(staging) and not _is_real_dir(staging)):
        os.unlink(staging)
    elif _is_real_dir(staging):
        shutil.rmtree(staging, ignore_errors=True)


def _finish_pending(directory: Path) -> None:
    """Complete (or discard) a save that was interrupted; never follows a link."""
    staging = directory / STAGING_NAME
    if not _is_real_dir(staging):
        return  # missing, or a link / file that is not our staging folder: loading ignores it, saving removes it
    staged_manifest = staging / MANIFEST_NAME
    if _is_real_file(staged_manifest):
        # a staged manifest may not be ours (a copied or downloaded directory): check all of it before moving any
        manifest = parse_manifest(_read_text(staged_manifest, str(directory)), str(directory),
                                  name=f"{STAGING_NAME}/{MANIFEST_NAME}")
        for entry in manifest["files"]:
            src = staging / entry["path"]
            if not _is_real_file(src) or not _real_parents(staging, entry["path"]):
                continue  # already moved, or a link planted in the staging folder: left where it is
            if not _real_parents(directory, entry["path"]):
                raise ManifestError(str(directory), [
                    f"{entry['path']}: a folder on its path is a link; an interrupted save is not finished through "
                    "links. Remove the link, or re-export"])
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
    if os.path.lexists(staging):
        _discard_staging(staging)  # a link or a stray file in the way: removed itself, its target untouched
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


def read_manifest(directory: str | Path, verify: bool = True) -> tuple[dict[str, Any], Path]:
    """Read and validate the manifest of an export directory; returns ``(manifest, root)``.

    Raises:
        ManifestError: listing every problem (missing manifest, bad JSON, wrong types, unsupported schema, unsafe
            paths, links leaving the directory, missing files, size or sha256 mismatches, components naming
            unlisted files).
    """
    root = Path(directory)
    staging = root / STAGING_NAME
    if _is_real_dir(staging) and _is_real_file(staging / MANIFEST_NAME):
        # an interrupted save whose commit point was reached: finish it, or read the files where they are
        try:
            _finish_pending(root)
        except OSError:
            return _read_from(root, staging, verify)
    return _read_from(root, None, verify)


def _read_text(path: Path, where: str) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise ManifestError(where, [f"{path.name} cannot be read ({e.strerror or e})"]) from None
    if len(data) > _MAX_MANIFEST_BYTES:
        raise ManifestError(where, [f"{path.name} is over {_MAX_MANIFEST_BYTES >> 20} MiB: not a manifest hfexport "
                                    "writes"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError(where, [f"{path.name} is not UTF-8 text"]) from None


_MAX_MANIFEST_BYTES = 64 << 20


def _read_from(root: Path, staging: Path | None, verify: bool) -> tuple[dict[str, Any], Path]:
    if not root.is_dir():
        raise ManifestError(str(root), ["no such directory"])
    manifest_path = (staging or root) / MANIFEST_NAME
    resolved_root = root.resolve()
    # a Hub cache snapshot holds links into its repo's blobs/: those stay inside the downloaded repo
    allowed_roots = [resolved_root, *_hub_blobs(root)]
    if not os.path.lexists(manifest_path):
        hint = (f" ({STAGING_NAME} is a link or not a folder: never followed)"
                if os.path.lexists(root / STAGING_NAME) and not _is_real_dir(root / STAGING_NAME) else "")
        raise ManifestError(str(root), [f"no {MANIFEST_NAME} (this is not an hfexport export directory){hint}"])
    if not _inside(manifest_path, allowed_roots) or not manifest_path.is_file():
        raise ManifestError(str(root), [f"{MANIFEST_NAME} is a link that leaves the export directory, or not a "
                                        "regular file: it is not read"])
    manifest, problems = check_manifest(_read_text(manifest_path, str(root)), str(root))
    for entry in manifest["files"]:
        path = entry["path"]
        location = _locate(root, staging, path)
        if location is None:
            problems.append(f"{path}: missing")
            continue
        if not _inside(location, allowed_roots):
            problems.append(f"{path}: is a link that leaves the export directory (-> {location.resolve()})")
            continue
        if not location.is_file():
            problems.append(f"{path}: not a regular file")
            continue
        if verify:
            size = location.stat().st_size
            if size != entry["size"]:
                problems.append(f"{path}: size {size} bytes on disk, {entry['size']} recorded in the manifest "
                                "(truncated or replaced)")
            elif sha256_file(location) != entry["sha256"]:
                problems.append(f"{path}: sha256 does not match the manifest (corrupt or modified)")
    if problems:
        fail(str(root), problems)
    manifest["_locations"] = {e["path"]: str(_locate(root, staging, e["path"])) for e in manifest["files"]}
    return manifest, root


def _inside(location: Path, allowed_roots: list[Path]) -> bool:
    target = location.resolve()
    return any(allowed in target.parents for allowed in allowed_roots)


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


# --- what a program may read beside itself ----------------------------------------------------------------------


def listed_files(folder: Path) -> set[str] | None:
    """The paths the ``export.json`` in ``folder`` lists (well-formed entries only), or None where there is none: a
    program saved alone with ``save_program``, which :func:`reference_problem` then checks by place only."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest, _ = check_manifest(_read_text(path, str(folder)), str(folder))
    except ManifestError:
        return set()
    return {entry["path"] for entry in manifest["files"]}


def reference_problem(folder: Path, name: str, listed: set[str] | None) -> str | None:
    """Why a program in ``folder`` must not read the file ``name`` it refers to (relative to the folder), or None.

    The backends' load checks use it for every file a program names (external data, a ``.bin``, a ``.ptd``): a safe
    relative name, listed in the manifest when there is one (its size and sha256 were checked), a regular file
    inside the folder (a Hub snapshot's links into its ``blobs/`` allowed, as the manifest allows them).
    """
    bad = check_relative(name)
    if bad:
        return bad
    if listed is not None and name not in listed:
        return f"file {name!r} is not listed in {MANIFEST_NAME} (its size and sha256 were never checked)"
    target = Path(folder) / name
    if not _inside(target, [Path(folder).resolve(), *_hub_blobs(Path(folder))]):
        return f"file {name!r} is a link that leaves the export folder (-> {target.resolve()})"
    if not target.is_file():
        return f"file {name!r} is not a regular file"
    return None
