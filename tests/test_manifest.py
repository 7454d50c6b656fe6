"""export.json: what a save writes, what a load refuses (every problem at once), and saves that survive crashes."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import hfexport
from hfexport import ExportedComponent, ExportedModel, ExportMetadata, ManifestError
from hfexport.manifest import MANIFEST_NAME, SCHEMA_VERSION, STAGING_NAME, read_manifest, write_export

ATOL = 1e-4


def _manifest(directory: Path) -> dict:
    return json.loads((directory / MANIFEST_NAME).read_text())


def _write_manifest(directory: Path, manifest: dict) -> None:
    (directory / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _logits(exported: ExportedModel, inputs: dict) -> torch.Tensor:
    return exported(**{k: v.clone() for k, v in inputs.items()}).logits


def _problems(directory: Path) -> list[str]:
    with pytest.raises(ManifestError) as info:
        ExportedModel.from_pretrained(directory)
    assert str(directory) in str(info.value)
    assert f"{len(info.value.problems)} problem(s)" in str(info.value)
    return info.value.problems


@pytest.fixture
def no_program_load(monkeypatch):
    """Fails the test if a program file is read: a refused export must be refused before any program is loaded."""

    def refuse(self, path):
        raise AssertionError(f"load_program({path}) was called on an export that should have been refused")

    monkeypatch.setattr(hfexport.DynamoExporter, "load_program", refuse)


# --- what save_pretrained writes -----------------------------------------------------------------------------------


def test_manifest_contents(saved_export: Path, tiny_export):
    manifest = _manifest(saved_export)
    assert manifest["schema_version"] == SCHEMA_VERSION == 2
    assert manifest["export_format"] == "dynamo"
    assert manifest["hfexport_version"] == hfexport.__version__

    on_disk = sorted(p.name for p in saved_export.iterdir() if p.name != MANIFEST_NAME)
    assert on_disk == ["config.json", "generation_config.json", "model.pt2"]
    assert [entry["path"] for entry in manifest["files"]] == on_disk
    for entry in manifest["files"]:
        path = saved_export / entry["path"]
        assert entry["size"] == path.stat().st_size > 0
        assert entry["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()

    assert list(manifest["components"]) == ["model"]
    component = manifest["components"]["model"]
    assert component["program"] == "model.pt2"
    assert component["files"] == ["model.pt2"]
    metadata = component["metadata"]
    assert metadata["architecture"] == "LlamaForCausalLM"
    assert metadata["export_config"]["export_format"] == "dynamo"
    assert metadata["export_config"]["dynamic"] is True
    assert metadata["export_dtype"] == "float32"
    assert set(metadata["kwargs"]) == {"input_ids", "attention_mask"}
    assert metadata["packages"]["torch"] == torch.__version__
    assert ExportMetadata.from_dict(metadata) == tiny_export.exported.components["model"].metadata
    assert manifest["configs"] == {"config": "config.json", "generation_config": "generation_config.json"}
    assert not (saved_export / STAGING_NAME).exists()


def test_our_files_are_plain_json(saved_export: Path):
    for name in (MANIFEST_NAME, "config.json", "generation_config.json"):
        data = saved_export / name
        assert not data.read_bytes().startswith(b"\x80"), f"{name} looks like a pickle"
        parsed = json.loads(data.read_text(encoding="utf-8"))
        assert isinstance(parsed, dict)
    config = json.loads((saved_export / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["hidden_size"] == 64 and config["num_key_value_heads"] == 2


def test_save_load_round_trip(saved_export: Path, tiny_export):
    loaded = ExportedModel.from_pretrained(saved_export)
    assert loaded.export_format is hfexport.ExportFormat.DYNAMO
    assert loaded.config.model_type == "llama" and loaded.config.hidden_size == 64
    assert loaded.generation_config is not None
    assert loaded.source_directory == saved_export
    assert isinstance(loaded.components["model"], ExportedComponent)
    torch.testing.assert_close(_logits(loaded, tiny_export.inputs), tiny_export.expected_logits, atol=ATOL, rtol=0)


# --- loading refuses -----------------------------------------------------------------------------------------------


def test_tampered_byte_is_a_sha_mismatch(saved_copy: Path, no_program_load):
    program = saved_copy / "model.pt2"
    data = bytearray(program.read_bytes())
    data[len(data) // 2] ^= 0xFF
    program.write_bytes(bytes(data))
    assert _problems(saved_copy) == ["model.pt2: sha256 does not match the manifest (corrupt or modified)"]


def test_truncated_file_is_a_size_mismatch(saved_copy: Path, no_program_load):
    program = saved_copy / "model.pt2"
    size = program.stat().st_size
    with open(program, "r+b") as f:
        f.truncate(size - 10)
    assert _problems(saved_copy) == [
        f"model.pt2: size {size - 10} bytes on disk, {size} recorded in the manifest (truncated or replaced)"
    ]


def test_missing_file(saved_copy: Path, no_program_load):
    (saved_copy / "generation_config.json").unlink()
    assert _problems(saved_copy) == ["generation_config.json: missing"]


@pytest.mark.parametrize("bad_path", ["/etc/hostname", "C:/Windows/win.ini"])
def test_absolute_path_in_manifest(saved_copy: Path, bad_path: str, no_program_load):
    manifest = _manifest(saved_copy)
    manifest["files"].append({"path": bad_path, "size": 1, "sha256": "0" * 64})
    _write_manifest(saved_copy, manifest)
    assert _problems(saved_copy) == [f"export.json: files[3]: file path {bad_path!r} is absolute"]


def test_dot_dot_path_in_manifest(saved_copy: Path, no_program_load):
    outside = saved_copy.parent / "outside.bin"
    outside.write_bytes(b"secret")
    manifest = _manifest(saved_copy)
    manifest["files"].append(
        {"path": "../outside.bin", "size": 6, "sha256": hashlib.sha256(b"secret").hexdigest()}
    )
    _write_manifest(saved_copy, manifest)
    assert _problems(saved_copy) == ["export.json: files[3]: file path '../outside.bin' leaves the export directory ('..')"]


def test_symlink_leaving_the_directory(saved_copy: Path, no_program_load):
    config = saved_copy / "config.json"
    outside = saved_copy.parent / "config-outside.json"
    shutil.move(config, outside)  # identical bytes: only the link itself is wrong
    config.symlink_to(outside)
    (problem,) = _problems(saved_copy)
    assert problem.startswith("config.json: is a link that leaves the export directory")
    assert str(outside.resolve()) in problem


def test_symlink_inside_the_directory_is_fine(saved_copy: Path, tiny_export):
    config = saved_copy / "config.json"
    shutil.move(config, saved_copy / "real-config.json")
    config.symlink_to("real-config.json")
    loaded = ExportedModel.from_pretrained(saved_copy)
    assert loaded.config.hidden_size == 64


def test_invalid_json(saved_copy: Path, no_program_load):
    (saved_copy / MANIFEST_NAME).write_text('{"schema_version": 1, "files": [')
    (problem,) = _problems(saved_copy)
    assert problem.startswith(f"{MANIFEST_NAME} is not valid JSON")


def test_manifest_that_is_not_an_object(saved_copy: Path, no_program_load):
    (saved_copy / MANIFEST_NAME).write_text("[1, 2]")
    assert _problems(saved_copy) == [f"{MANIFEST_NAME} must hold a JSON object, not list [1, 2]"]


def test_a_version_1_export_is_refused_with_the_fix(saved_copy: Path, no_program_load):
    manifest = json.loads((saved_copy / MANIFEST_NAME).read_text())
    manifest["schema_version"] = 1
    (saved_copy / MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(ManifestError) as info:
        ExportedModel.from_pretrained(saved_copy)
    assert "schema_version 1 is not supported" in str(info.value)
    assert "re-export the model with this hfexport" in str(info.value)


def test_newer_schema_version(saved_copy: Path, no_program_load):
    manifest = _manifest(saved_copy)
    manifest["schema_version"] = SCHEMA_VERSION + 1
    _write_manifest(saved_copy, manifest)
    (problem,) = _problems(saved_copy)
    assert f"schema_version {SCHEMA_VERSION + 1}" in problem and "not supported" in problem


def test_not_an_export_directory(tmp_path: Path):
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(ManifestError, match="no export.json"):
        ExportedModel.from_pretrained(tmp_path)


def test_component_naming_an_unlisted_file(saved_copy: Path, no_program_load):
    manifest = _manifest(saved_copy)
    manifest["components"]["model"]["files"].append("weights.bin")
    del manifest["components"]["model"]["metadata"]
    _write_manifest(saved_copy, manifest)
    assert _problems(saved_copy) == [
        "export.json: component 'model': file 'weights.bin' is not listed in 'files'",
        "export.json: component 'model': 'metadata' must be an object, got nothing",
    ]


def test_every_problem_is_listed_at_once(saved_copy: Path, no_program_load):
    program = saved_copy / "model.pt2"
    data = bytearray(program.read_bytes())
    data[100] ^= 0x01
    program.write_bytes(bytes(data))  # sha mismatch
    config = saved_copy / "config.json"
    config.write_bytes(config.read_bytes()[:-5])  # size mismatch
    (saved_copy / "generation_config.json").unlink()  # missing
    manifest = _manifest(saved_copy)
    manifest["files"] += [
        {"path": "/abs/file", "size": 0, "sha256": ""},
        {"path": "a/../../x", "size": 0, "sha256": ""},
    ]
    _write_manifest(saved_copy, manifest)

    problems = _problems(saved_copy)
    assert len(problems) == 5, problems
    assert any(p.startswith("config.json: size") for p in problems)
    assert "generation_config.json: missing" in problems
    assert any(p.startswith("model.pt2: sha256") for p in problems)
    assert "export.json: files[3]: file path '/abs/file' is absolute" in problems
    assert "export.json: files[4]: file path 'a/../../x' leaves the export directory ('..')" in problems


def test_read_manifest_without_verification_skips_hashes(saved_copy: Path):
    program = saved_copy / "model.pt2"
    data = bytearray(program.read_bytes())
    data[-1] ^= 0xFF
    program.write_bytes(bytes(data))
    manifest, root = read_manifest(saved_copy, verify=False)
    assert root == saved_copy
    assert manifest["_locations"]["model.pt2"] == str(program)
    with pytest.raises(ManifestError):
        read_manifest(saved_copy)


# --- atomic save ------------------------------------------------------------------------------------------------------


def test_crash_while_writing_a_component_keeps_the_previous_export(tmp_path, tiny_export, tiny_export_b, monkeypatch):
    directory = tmp_path / "export"
    tiny_export.exported.save_pretrained(directory)
    before = _snapshot(directory)
    expected = _logits(ExportedModel.from_pretrained(directory), tiny_export.inputs)

    component_b = tiny_export_b.exported.components["model"]
    # two distinct programs (components sharing one program object share its file, written once)
    second = ExportedComponent(copy.copy(component_b.program), component_b.metadata)
    two_components = ExportedModel(
        {"model": component_b, "second": second}, "dynamo", config=tiny_export_b.exported.config
    )
    real_save = hfexport.DynamoExporter.save_program
    calls = []

    def crash_on_second(self, program, path, extra_files=None):
        calls.append(Path(path).name)
        if len(calls) == 2:
            Path(path).write_bytes(b"half a program")
            raise RuntimeError("disk full")
        real_save(self, program, path, extra_files)

    monkeypatch.setattr(hfexport.DynamoExporter, "save_program", crash_on_second)
    with pytest.raises(RuntimeError, match="disk full"):
        two_components.save_pretrained(directory)
    assert calls == ["model.pt2", "second.pt2"]

    assert _snapshot(directory) == before  # not one byte of the previous export changed
    assert not (directory / STAGING_NAME).exists()
    monkeypatch.undo()
    reloaded = ExportedModel.from_pretrained(directory)
    torch.testing.assert_close(_logits(reloaded, tiny_export.inputs), expected, atol=0, rtol=0)
    torch.testing.assert_close(expected, tiny_export.expected_logits, atol=ATOL, rtol=0)


def test_exception_inside_write_files_leaves_the_directory_alone(saved_copy: Path, tiny_export):
    before = _snapshot(saved_copy)

    def write_files(staging: Path) -> dict:
        (staging / "model.pt2").write_bytes(b"new program")
        (staging / "export.json").write_text("{}")
        raise KeyboardInterrupt  # even a BaseException must not leave the staging dir behind

    with pytest.raises(KeyboardInterrupt):
        write_export(saved_copy, write_files)
    assert _snapshot(saved_copy) == before
    assert not (saved_copy / STAGING_NAME).exists()
    loaded = ExportedModel.from_pretrained(saved_copy)
    torch.testing.assert_close(_logits(loaded, tiny_export.inputs), tiny_export.expected_logits, atol=ATOL, rtol=0)


def test_saving_over_an_export_replaces_it(saved_copy: Path, tiny_export_b):
    tiny_export_b.exported.save_pretrained(saved_copy)
    loaded = ExportedModel.from_pretrained(saved_copy)
    torch.testing.assert_close(_logits(loaded, tiny_export_b.inputs), tiny_export_b.expected_logits, atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    "already_moved", [[], ["model.pt2"], ["config.json", "model.pt2"]], ids=["none", "program", "most"]
)
def test_crash_after_the_commit_point_is_finished_on_load(
    saved_copy: Path, saved_export_b: Path, tiny_export, tiny_export_b, already_moved
):
    # what a save of export B leaves when killed after writing its staged manifest, mid-way through the moves
    staging = saved_copy / STAGING_NAME
    shutil.copytree(saved_export_b, staging)
    for name in already_moved:
        os.replace(staging / name, saved_copy / name)
    assert not tiny_export.expected_logits.allclose(tiny_export_b.expected_logits, atol=1e-3)

    loaded = ExportedModel.from_pretrained(saved_copy)
    torch.testing.assert_close(_logits(loaded, tiny_export_b.inputs), tiny_export_b.expected_logits, atol=ATOL, rtol=0)
    assert not staging.exists()
    assert _snapshot(saved_copy) == _snapshot(saved_export_b)  # exactly export B, finished in place


def test_crash_before_the_commit_point_is_ignored_then_cleaned(saved_copy: Path, tiny_export, tiny_export_b):
    staging = saved_copy / STAGING_NAME
    staging.mkdir()
    (staging / "model.pt2").write_bytes(b"partial")  # no staged manifest: the save never committed
    loaded = ExportedModel.from_pretrained(saved_copy)
    torch.testing.assert_close(_logits(loaded, tiny_export.inputs), tiny_export.expected_logits, atol=ATOL, rtol=0)
    tiny_export_b.exported.save_pretrained(saved_copy)  # the next save clears the leftovers
    assert not staging.exists()
    manifest = _manifest(saved_copy)
    assert STAGING_NAME not in json.dumps(manifest)


def test_saving_next_to_unrelated_files_leaves_them_untouched(tmp_path: Path, tiny_export, tiny_export_b):
    directory = tmp_path / "repo"
    (directory / "onnx").mkdir(parents=True)
    unrelated = {
        "model.safetensors": os.urandom(4096),
        "README.md": b"# my model\n",
        "onnx/model.onnx": b"not ours",
    }
    for name, data in unrelated.items():
        (directory / name).write_bytes(data)

    tiny_export.exported.save_pretrained(directory)
    tiny_export_b.exported.save_pretrained(directory)  # and again, over the first export

    for name, data in unrelated.items():
        assert (directory / name).read_bytes() == data
    listed = {entry["path"] for entry in _manifest(directory)["files"]}
    assert listed == {"config.json", "generation_config.json", "model.pt2"}
    loaded = ExportedModel.from_pretrained(directory)
    torch.testing.assert_close(_logits(loaded, tiny_export_b.inputs), tiny_export_b.expected_logits, atol=ATOL, rtol=0)


def test_committed_save_in_a_directory_that_cannot_be_written_loads_from_staging(
    saved_copy: Path, saved_export_b: Path, tiny_export_b, monkeypatch
):
    staging = saved_copy / STAGING_NAME
    shutil.copytree(saved_export_b, staging)

    def read_only(src, dst):
        raise PermissionError(f"read-only file system: {dst}")

    monkeypatch.setattr(hfexport.manifest.os, "replace", read_only)
    loaded = ExportedModel.from_pretrained(saved_copy)
    torch.testing.assert_close(_logits(loaded, tiny_export_b.inputs), tiny_export_b.expected_logits, atol=ATOL, rtol=0)
    assert staging.is_dir()  # nothing could be moved; the staged files were read where they are


def test_staged_manifest_with_unsafe_paths_moves_nothing(tmp_path: Path, saved_export: Path, saved_export_b: Path):
    # a directory from elsewhere can carry a ".hfexport-staging/export.json" of its own: finishing that "save"
    # must not move files by paths that leave the directory
    directory = tmp_path / "x" / "export"
    shutil.copytree(saved_export, directory)
    staging = directory / STAGING_NAME
    shutil.copytree(saved_export_b, staging)
    manifest = _manifest(staging)
    manifest["files"].append({"path": "../../moved", "size": 4, "sha256": hashlib.sha256(b"mine").hexdigest()})
    manifest["files"].append({"path": "/abs", "size": 0, "sha256": ""})
    _write_manifest(staging, manifest)
    victim = tmp_path / "x" / "moved"  # == staging / "../../moved"
    victim.write_bytes(b"mine")
    before = _snapshot(directory)

    with pytest.raises(ManifestError) as info:
        ExportedModel.from_pretrained(directory)
    assert len(info.value.problems) == 2
    assert any("'../../moved'" in p for p in info.value.problems)
    assert any("'/abs'" in p for p in info.value.problems)
    assert victim.read_bytes() == b"mine"
    assert not (tmp_path / "moved").exists()
    assert _snapshot(directory) == before  # nothing was moved in, either


def test_staged_manifest_that_is_not_json(saved_copy: Path):
    staging = saved_copy / STAGING_NAME
    staging.mkdir()
    (staging / MANIFEST_NAME).write_text("{oops")
    with pytest.raises(ManifestError, match="not valid JSON"):
        ExportedModel.from_pretrained(saved_copy)


def test_manifest_may_not_name_files_in_the_staging_folder(saved_copy: Path, no_program_load):
    (saved_copy / STAGING_NAME).mkdir()
    (saved_copy / STAGING_NAME / "notes.txt").write_bytes(b"hi")
    manifest = _manifest(saved_copy)
    entry = {"path": f"{STAGING_NAME}/notes.txt", "size": 2, "sha256": hashlib.sha256(b"hi").hexdigest()}
    manifest["files"].append(entry)
    _write_manifest(saved_copy, manifest)
    (problem,) = _problems(saved_copy)
    assert problem == (f"export.json: files[3]: file path '{STAGING_NAME}/notes.txt' is inside the staging folder "
                       f"{STAGING_NAME!r}")


def test_export_with_named_dims_saves_a_config_that_reloads(tmp_path: Path, make_tiny_llama, tiny_export):
    batch = torch.export.Dim("batch", min=1, max=32)
    seq = torch.export.Dim("seq", min=2, max=64)
    config = hfexport.DynamoConfig(
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}}
    )
    model = make_tiny_llama(0)
    exported = hfexport.DynamoExporter().export(model, dict(tiny_export.inputs), config=config)
    exported.save_pretrained(tmp_path)

    saved = _manifest(tmp_path)["components"]["model"]["metadata"]["export_config"]
    reloaded = hfexport.AutoExportConfig.from_dict(saved)
    assert type(reloaded) is hfexport.DynamoConfig
    shapes = reloaded.dynamic_shapes
    assert shapes["input_ids"][0] is shapes["attention_mask"][0]
    assert (shapes["input_ids"][1].__name__, shapes["input_ids"][1].min, shapes["input_ids"][1].max) == ("seq", 2, 64)

    loaded = ExportedModel.from_pretrained(tmp_path)
    other = {"input_ids": torch.randint(0, 128, (3, 11)), "attention_mask": torch.ones(3, 11, dtype=torch.long)}
    with torch.no_grad():
        expected = model(**other).logits
    torch.testing.assert_close(_logits(loaded, other), expected, atol=ATOL, rtol=0)
