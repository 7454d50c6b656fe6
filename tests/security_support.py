"""Shared pieces of the security and robustness tables (tests/test_security*.py).

A *case* is one thing an attacker or a careless user does to a saved export: it changes files in a copy of a tiny
saved export (then, by default, *reseals* ``export.json`` so that sizes and sha256 match the tampered files: that is
what a malicious export published on a hub looks like), and states the typed hfexport error and the words of its
message that loading (or calling) must give.

Payload cases write a marker file where the payload would: the test asserts the marker never appears.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from hfexport.testing.tiny import TINY_CASES

CASE = TINY_CASES["llama"]
MANIFEST = "export.json"


@dataclasses.dataclass
class Case:
    """One row of a security table.

    Attributes:
        id: The test id.
        fmt: ``dynamo``, ``onnx``, ``openvino`` or ``executorch``: which saved export is copied.
        tamper: Changes the copied folder (gets the folder and the per-test marker path a payload would create).
        error: The hfexport error type loading must raise.
        match: Words (a regex, searched case-insensitively) the message must hold: the file or field, and what to do.
        reseal: Rewrite the manifest's sizes and sha256 to match the tampered files first.
        call: ``None``: the failure is at ``from_pretrained``. Otherwise a function ``call(exported, inputs)`` that
            must raise (the load itself must succeed).
    """

    id: str
    fmt: str
    tamper: Callable[[Path, Path], None]
    error: type
    match: str
    reseal: bool = True
    call: Callable[[Any, dict], Any] | None = None
    after: Callable[[Path, Path], None] | None = None
    """Checks after the refusal (gets the folder and the marker path): e.g. that another folder is untouched."""

    @property
    def param(self) -> Any:
        return pytest.param(self, id=f"{self.fmt}-{self.id}")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def manifest(folder: Path) -> dict:
    return json.loads((folder / MANIFEST).read_text())


def write_manifest(folder: Path, body: Any) -> None:
    (folder / MANIFEST).write_text(json.dumps(body, indent=1))


def reseal(folder: Path) -> None:
    """Make the manifest's ``files`` match what is on disk now (sizes and sha256 of the listed files that exist)."""
    body = manifest(folder)
    if not isinstance(body, dict) or not isinstance(body.get("files"), list):
        return
    for entry in body["files"]:
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            continue
        path = folder / entry["path"]
        if path.is_file():
            entry["size"] = path.stat().st_size
            entry["sha256"] = sha256(path)
    write_manifest(folder, body)


def add_file(folder: Path, name: str, data: bytes, component: str | None = None) -> None:
    """Write ``name`` into the folder and list it in the manifest (and in ``component``'s files)."""
    (folder / name).parent.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    body = manifest(folder)
    body["files"].append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
    if component is not None:
        body["components"][component]["files"].append(name)
    write_manifest(folder, body)


def program_file(folder: Path, component: str = "model") -> Path:
    body = manifest(folder)
    return folder / body["components"][component]["program"]


def marker_payload(marker: Path) -> str:
    """Python source a payload runs: it creates ``marker``."""
    return f"open({str(marker)!r}, 'w').write('pwned')"


def inputs() -> dict[str, torch.Tensor]:
    """The tiny Llama's 2 x 7 sample, as the saved exports were traced with."""
    return CASE.inputs(2, 7)


def _export(fmt: str, model: torch.nn.Module, directory: Path) -> Path:
    import hfexport

    exporter, config = {
        "dynamo": (hfexport.DynamoExporter, lambda: hfexport.DynamoConfig(dynamic=True)),
        "onnx": (hfexport.OnnxExporter, lambda: hfexport.OnnxConfig(dynamic=True)),
        "openvino": (hfexport.OpenVINOExporter, lambda: hfexport.OpenVINOConfig(dynamic=True)),
        "executorch": (hfexport.ExecutorchExporter, lambda: hfexport.ExecutorchConfig(dynamic=True)),
        "aoti": (hfexport.AotiExporter, lambda: hfexport.AotiConfig(dynamic=True, gemm="aten")),  # quick compile
    }[fmt]
    exported = exporter().export(model, CASE.inputs(2, 7), config())
    exported.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model() -> torch.nn.Module:
    return CASE.build()


@pytest.fixture(scope="session")
def saved_exports(tiny_model, tmp_path_factory) -> Callable[[str], Path]:
    """``saved_exports(fmt)``: the tiny Llama exported to ``fmt`` and saved once per test session (read-only), shared
    by the xdist workers of the session (an ExecuTorch export is ~35 s, and three files ask for it): the first worker
    to ask exports under a file lock in the session's common temporary folder, the others read its folder."""
    from filelock import FileLock

    made: dict[str, Path] = {}
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "saved-exports"
    shared.mkdir(exist_ok=True)

    def get(fmt: str) -> Path:
        if fmt not in made:
            folder, done = shared / fmt / "export", shared / fmt / "done"
            with FileLock(str(shared / f"{fmt}.lock")):
                if not done.exists():
                    shutil.rmtree(folder.parent, ignore_errors=True)  # (a worker that died half-way)
                    _export(fmt, tiny_model, folder)
                    done.touch()
            made[fmt] = folder
        return made[fmt]

    return get


def copy_export(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, symlinks=True)
    return target
