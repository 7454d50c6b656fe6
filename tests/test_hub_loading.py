"""``ExportedModel.from_pretrained(repo_id)`` against a Hugging Face Hub cache on disk, offline.

The cache is laid out as ``huggingface_hub`` writes it: ``models--org--name/refs/main`` holds the commit and
``snapshots/<commit>/`` the files, as relative symlinks into ``blobs/`` (or as plain files, as on filesystems
without symlinks). Only the files the manifest names may be asked for.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import pytest
import torch

from hfexport import ExportedModel, ManifestError

REPO_ID = "org/name"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
BIG = "model.safetensors"
ATOL = 1e-4


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """HF_HUB_OFFLINE=1: huggingface_hub reads the variable once, at import, into ``constants.HF_HUB_OFFLINE``
    (what ``is_offline_mode()`` returns), so the constant is patched too. The cwd is an empty directory so that
    ``org/name`` cannot be taken for a local path."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)


@pytest.fixture
def downloads(monkeypatch):
    """Records the filenames (with subfolder) that hf_hub_download is asked for."""
    real = huggingface_hub.hf_hub_download
    asked: list[str] = []

    def recording(repo_id, filename, *args, subfolder=None, **kwargs):
        asked.append(f"{subfolder}/{filename}" if subfolder else filename)
        return real(repo_id, filename, *args, subfolder=subfolder, **kwargs)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", recording)
    return asked


def _build_cache(cache: Path, files: dict[str, Path | bytes], *, symlinks: bool, big_file: bool = True) -> Path:
    """A Hub cache for REPO_ID at COMMIT holding ``files`` (repo path -> source file or bytes); returns the snapshot."""
    repo = cache / ("models--" + REPO_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / COMMIT
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    blobs = repo / "blobs"
    blobs.mkdir()
    for repo_path, source in files.items():
        data = source if isinstance(source, bytes) else source.read_bytes()
        target = snapshot / repo_path
        target.parent.mkdir(parents=True, exist_ok=True)
        if symlinks:
            blob = blobs / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            target.symlink_to(os.path.relpath(blob, target.parent))
        else:
            target.write_bytes(data)
    if big_file:
        big = snapshot / BIG
        with open(big, "wb") as f:
            f.truncate(2 * 1024**3)  # 2 GiB, sparse: reading it (or hashing it) would show in the test's time
    return snapshot


def _export_files(saved: Path, prefix: str = "") -> dict[str, Path]:
    return {prefix + p.name: p for p in saved.iterdir() if p.is_file()}


def _logits(exported: ExportedModel, inputs: dict) -> torch.Tensor:
    return exported(**{k: v.clone() for k, v in inputs.items()}).logits


@pytest.mark.parametrize("symlinks", [True, False], ids=["blob-symlinks", "plain-files"])
def test_from_pretrained_repo_id_offline(tmp_path, saved_export, tiny_export, downloads, symlinks):
    cache = tmp_path / "hub"
    _build_cache(cache, _export_files(saved_export), symlinks=symlinks)

    loaded = ExportedModel.from_pretrained(REPO_ID, cache_dir=cache)

    torch.testing.assert_close(_logits(loaded, tiny_export.inputs), tiny_export.expected_logits, atol=ATOL, rtol=0)
    assert loaded.config.hidden_size == 64
    named = {e["path"] for e in json.loads((saved_export / "export.json").read_text())["files"]}
    assert downloads[0] == "export.json"
    assert sorted(downloads[1:]) == sorted(named)
    assert BIG not in downloads


def test_from_pretrained_local_files_only_and_a_commit_revision(tmp_path, saved_export, tiny_export, downloads):
    cache = tmp_path / "hub"
    _build_cache(cache, _export_files(saved_export), symlinks=False, big_file=False)
    loaded = ExportedModel.from_pretrained(REPO_ID, cache_dir=cache, local_files_only=True, revision=COMMIT)
    torch.testing.assert_close(_logits(loaded, tiny_export.inputs), tiny_export.expected_logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("symlinks", [True, False], ids=["blob-symlinks", "plain-files"])
def test_from_pretrained_subfolder(tmp_path, saved_export, saved_export_b, tiny_export_b, downloads, symlinks):
    cache = tmp_path / "hub"
    files = {**_export_files(saved_export), **_export_files(saved_export_b, prefix="exports/dynamo/")}
    _build_cache(cache, files, symlinks=symlinks)

    loaded = ExportedModel.from_pretrained(REPO_ID, cache_dir=cache, subfolder="exports/dynamo")

    # the subfolder's export (seed 1), not the one at the repo root (seed 0)
    torch.testing.assert_close(_logits(loaded, tiny_export_b.inputs), tiny_export_b.expected_logits, atol=ATOL, rtol=0)
    assert all(name.startswith("exports/dynamo/") for name in downloads), downloads


def test_local_directory_with_subfolder(tmp_path, saved_export, tiny_export):
    root = tmp_path / "repo"
    shutil.copytree(saved_export, root / "sub")
    loaded = ExportedModel.from_pretrained(root, subfolder="sub")
    torch.testing.assert_close(_logits(loaded, tiny_export.inputs), tiny_export.expected_logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../../x"])
def test_unsafe_manifest_path_is_refused_before_any_download(tmp_path, saved_export, downloads, bad):
    manifest = json.loads((saved_export / "export.json").read_text())
    manifest["files"].insert(0, {"path": bad, "size": 1, "sha256": "0" * 64})
    files: dict[str, Path | bytes] = dict(_export_files(saved_export))
    files["export.json"] = json.dumps(manifest).encode()
    _build_cache(tmp_path / "hub", files, symlinks=False, big_file=False)

    with pytest.raises(ManifestError) as info:
        ExportedModel.from_pretrained(REPO_ID, cache_dir=tmp_path / "hub")
    assert len(info.value.problems) == 1 and repr(bad) in info.value.problems[0]
    assert downloads == ["export.json"]  # nothing the manifest names was fetched


def test_tampered_file_in_the_cache_is_refused(tmp_path, saved_export, downloads):
    files: dict[str, Path | bytes] = dict(_export_files(saved_export))
    program = bytearray((saved_export / "model.pt2").read_bytes())
    program[1000] ^= 0xFF
    files["model.pt2"] = bytes(program)
    _build_cache(tmp_path / "hub", files, symlinks=True, big_file=False)
    with pytest.raises(ManifestError) as info:
        ExportedModel.from_pretrained(REPO_ID, cache_dir=tmp_path / "hub")
    assert info.value.problems == ["model.pt2: sha256 does not match the manifest (corrupt or modified)"]


def test_link_out_of_the_repo_cache_is_still_refused(tmp_path, saved_export):
    files: dict[str, Path | bytes] = dict(_export_files(saved_export))
    snapshot = _build_cache(tmp_path / "hub", files, symlinks=True, big_file=False)
    # config.json now points at an identical file outside this repo's blobs
    outside = tmp_path / "elsewhere.json"
    shutil.copy(saved_export / "config.json", outside)
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(outside)
    with pytest.raises(ManifestError) as info:
        ExportedModel.from_pretrained(REPO_ID, cache_dir=tmp_path / "hub")
    (problem,) = info.value.problems
    assert problem.startswith("config.json: is a link that leaves the export directory")


def test_repo_missing_from_the_cache(tmp_path):
    with pytest.raises(ManifestError) as info:
        ExportedModel.from_pretrained(REPO_ID, cache_dir=tmp_path / "empty-hub")
    (problem,) = info.value.problems
    assert "export.json could not be fetched from the Hub" in problem


def test_link_into_another_repos_blobs_is_refused(tmp_path, saved_export):
    cache = tmp_path / "hub"
    snapshot = _build_cache(cache, dict(_export_files(saved_export)), symlinks=True, big_file=False)
    other_blobs = cache / "models--someone--else" / "blobs"
    other_blobs.mkdir(parents=True)
    stolen = other_blobs / "cafe"
    shutil.copy(saved_export / "config.json", stolen)
    (snapshot / "config.json").unlink()
    (snapshot / "config.json").symlink_to(os.path.relpath(stolen, snapshot))
    with pytest.raises(ManifestError) as info:
        ExportedModel.from_pretrained(REPO_ID, cache_dir=cache)
    (problem,) = info.value.problems
    assert problem.startswith("config.json: is a link that leaves the export directory")


def test_blobs_are_only_trusted_inside_a_snapshot_folder(tmp_path, saved_export):
    # a local export next to a folder that happens to be called blobs/ gets no exemption
    root = tmp_path / "models--org--name"
    export = root / "exports" / COMMIT
    shutil.copytree(saved_export, export)
    (root / "blobs").mkdir()
    shutil.move(export / "config.json", root / "blobs" / "config.json")
    (export / "config.json").symlink_to(root / "blobs" / "config.json")
    with pytest.raises(ManifestError, match="config.json: is a link that leaves the export directory"):
        ExportedModel.from_pretrained(export)


def test_manifest_that_is_not_json_is_refused_before_any_download(tmp_path, saved_export, downloads):
    files: dict[str, Path | bytes] = dict(_export_files(saved_export))
    files["export.json"] = b'{"files": ['
    _build_cache(tmp_path / "hub", files, symlinks=False, big_file=False)
    with pytest.raises(ManifestError, match="export.json is not valid JSON"):
        ExportedModel.from_pretrained(REPO_ID, cache_dir=tmp_path / "hub")
    assert downloads == ["export.json"]


def test_manifest_that_is_a_json_list_is_a_manifest_error(tmp_path, saved_export):
    files: dict[str, Path | bytes] = dict(_export_files(saved_export))
    files["export.json"] = b"[]"
    _build_cache(tmp_path / "hub", files, symlinks=False, big_file=False)
    with pytest.raises(ManifestError):
        ExportedModel.from_pretrained(REPO_ID, cache_dir=tmp_path / "hub")


def test_named_file_missing_from_the_repo_is_a_manifest_error(tmp_path, saved_export):
    files: dict[str, Path | bytes] = dict(_export_files(saved_export))
    del files["model.pt2"]
    del files["config.json"]
    _build_cache(tmp_path / "hub", files, symlinks=True, big_file=False)
    with pytest.raises(ManifestError) as info:
        ExportedModel.from_pretrained(REPO_ID, cache_dir=tmp_path / "hub")
    assert len(info.value.problems) == 2
