"""The security and robustness table: what an attacker or a careless user does to a saved export, and the typed
error (naming the file or field, saying what to do) that loading or calling must give instead.

Rows: the manifest and folder cases below on each of the four formats, the ``.pt2`` payloads of
:mod:`security_pt2`, and the ONNX / OpenVINO / ExecuTorch program cases of :mod:`test_security_formats`. Payload rows
write a marker file where their code would: it must never appear. Threat model: docs/security.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from hfexport import ConfigError, ExportedModel, ManifestError, UnsupportedError
from hfexport.pytrees import register_cache_classes
from security_pt2 import PAYLOADS, PT2_CASES
from security_support import (
    Case, copy_export, inputs, manifest, program_file, reseal, saved_exports, tiny_model,  # noqa: F401
    write_manifest,
)
from test_security_formats import FORMAT_CASES

FORMATS = ["dynamo", "onnx", "openvino", "executorch"]


# --- tampering with the manifest and the folder (the same on every format) ---------------------------------------


def _edit(edit):
    def tamper(folder: Path, marker: Path) -> None:
        body = manifest(folder)
        edit(body)
        write_manifest(folder, body)

    return tamper


def _flip_byte(folder: Path, marker: Path) -> None:
    path = program_file(folder)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(folder: Path, marker: Path) -> None:
    path = program_file(folder)
    path.write_bytes(path.read_bytes()[:-10])


def _staging_link(folder: Path, marker: Path) -> None:
    """The folder's staging folder is a link to another export with a committed-looking manifest; the folder's own
    manifest is gone, so an unguarded recovery would move the other export's files in."""
    victim = marker.parent / "victim"
    shutil.copytree(folder, victim)
    shutil.copy(victim / "export.json", victim / ".keep-export.json")
    (folder / "export.json").unlink()
    (folder / ".hfexport-staging").symlink_to(victim, target_is_directory=True)


def _victim_untouched(folder: Path, marker: Path) -> None:
    victim = marker.parent / "victim"
    assert (victim / "export.json").is_file() and (victim / "config.json").is_file()
    assert (victim / "export.json").read_bytes() == (victim / ".keep-export.json").read_bytes()
    assert not (folder / "config.json").is_symlink()


def _staged_file_link(folder: Path, marker: Path) -> None:
    """A committed staged manifest whose staged file is a link to a file outside: recovery must not move it in."""
    outside = marker.parent / "outside.json"
    outside.write_text('{"secret": 1}')
    staging = folder / ".hfexport-staging"
    staging.mkdir()
    shutil.copy(folder / "export.json", staging / "export.json")
    (folder / "config.json").unlink()
    (staging / "config.json").symlink_to(outside)


def _outside_intact(folder: Path, marker: Path) -> None:
    assert (marker.parent / "outside.json").read_text() == '{"secret": 1}'
    assert not (folder / "config.json").exists()


def _manifest_link(folder: Path, marker: Path) -> None:
    outside = marker.parent / "elsewhere.json"
    shutil.move(folder / "export.json", outside)
    (folder / "export.json").symlink_to(outside)


def _config_link(folder: Path, marker: Path) -> None:
    outside = marker.parent / "config-outside.json"
    shutil.move(folder / "config.json", outside)
    (folder / "config.json").symlink_to(outside)


def _deep_json(folder: Path, marker: Path) -> None:
    (folder / "export.json").write_text("[" * 200_000 + "]" * 200_000)


def _many_entries(folder: Path, marker: Path) -> None:
    body = manifest(folder)
    body["files"] += [{"path": f"/abs/{i}", "size": 1, "sha256": "0" * 64} for i in range(300_000)]
    write_manifest(folder, body)


def _short_message(folder: Path, marker: Path) -> None:
    pass  # the length is checked in test_security_table itself (any row's message stays short)


def _bad_config(text: str, name: str = "config.json"):
    def tamper(folder: Path, marker: Path) -> None:
        (folder / name).write_text(text)

    return tamper


def _metadata(edit):
    def change(body: dict) -> None:
        edit(next(iter(body["components"].values()))["metadata"])

    return _edit(change)


def _set_first_input(field, value):
    def edit(metadata: dict) -> None:
        metadata["inputs"][0][field] = value

    return _metadata(edit)


def _fractional_ids(exported, sample):
    return exported(**{**sample, "input_ids": sample["input_ids"].float() + 0.25})


def _flat_ids(exported, sample):
    return exported(input_ids=sample["input_ids"][0], attention_mask=sample["attention_mask"][0])


def _no_mask(exported, sample):
    return exported(input_ids=sample["input_ids"])


GENERIC = [
    # (id, tamper, error, match, reseal, call, after)
    ("flipped-byte", _flip_byte, ManifestError, r"sha256 does not match the manifest", False, None, None),
    ("truncated", _truncate, ManifestError, r"size \d+ bytes on disk, \d+ recorded .*truncated", False, None, None),
    ("missing-manifest", lambda f, m: (f / "export.json").unlink(), ManifestError, r"no export.json", False, None,
     None),
    ("staging-link-to-another-export", _staging_link, ManifestError, r"staging is a link.*never followed", False,
     None, _victim_untouched),
    ("staged-file-link-out", _staged_file_link, ManifestError, r"config.json: missing", False, None,
     _outside_intact),
    ("manifest-link-out", _manifest_link, ManifestError, r"export.json is a link that leaves", False, None, None),
    ("config-link-out", _config_link, ManifestError, r"config.json: is a link that leaves", False, None, None),
    ("files-as-strings", _edit(lambda b: b.update(files=[e["path"] for e in b["files"]])), ManifestError,
     r"files\[0\] must be an object with path, size and sha256", False, None, None),
    ("files-not-a-list", _edit(lambda b: b.update(files={"a": 1})), ManifestError, r"'files' must be a list",
     False, None, None),
    ("configs-as-list", _edit(lambda b: b.update(configs=["config.json"])), ManifestError,
     r"'configs' must be an object", False, None, None),
    ("components-as-list", _edit(lambda b: b.update(components=[1])), ManifestError,
     r"'components' must be a non-empty object", False, None, None),
    ("component-without-files", _edit(lambda b: next(iter(b["components"].values())).update(files=[])),
     ManifestError, r"'files' must be a non-empty list of file paths", False, None, None),
    ("metadata-not-an-object", _edit(lambda b: next(iter(b["components"].values())).update(metadata=[])),
     ManifestError, r"'metadata' must be an object", False, None, None),
    ("metadata-inputs-wrong-type", _metadata(lambda m: m.update(inputs="input_ids")), ManifestError,
     r"metadata field 'inputs' must be a list", False, None, None),
    ("metadata-kwargs-wrong-type", _metadata(lambda m: m.update(kwargs=[1, 2])), ManifestError,
     r"metadata field 'kwargs' must be an object", False, None, None),
    ("metadata-bad-dtype", _set_first_input("dtype", "float99"), ManifestError,
     r"metadata field 'input_ids.dtype' must be a torch dtype name", False, None, None),
    ("metadata-bad-role", _set_first_input("role", "payload"), ManifestError,
     r"metadata field 'input_ids.role' must be one of", False, None, None),
    ("deep-json", _deep_json, ManifestError, r"export.json is nested too deeply", False, None, None),
    ("size-as-string", _edit(lambda b: b["files"][0].update(size=str(b["files"][0]["size"]))), ManifestError,
     r"files\[0\] \(.*\): size must be a non-negative integer, got '\d+'", False, None, None),
    ("sha-not-hex", _edit(lambda b: b["files"][0].update(sha256="z" * 64)), ManifestError,
     r"sha256 must be 64 lowercase hex digits", False, None, None),
    ("duplicate-path", _edit(lambda b: b["files"].append(dict(b["files"][0]))), ManifestError, r"is listed twice",
     False, None, None),
    ("nul-in-path", _edit(lambda b: b["files"].append({"path": "a\x00b", "size": 0, "sha256": "0" * 64})),
     ManifestError, r"contains a backslash or NUL", False, None, None),
    ("300k-entries", _many_entries, ManifestError, r"\(300000 problem\(s\)\).*\.\.\. and 299980 more problems", False, None, None),
    ("schema-version-string", _edit(lambda b: b.update(schema_version="1")), ManifestError,
     r"schema_version '1' is not supported", False, None, None),
    ("unknown-format", _edit(lambda b: b.update(export_format="tensorflow")), ConfigError,
     r"no backend registered for 'tensorflow'", False, None, None),
    ("config-not-json", _bad_config("{not json"), ManifestError, r"config.json: cannot be read as a model config",
     True, None, None),
    ("config-not-an-object", _bad_config('[1, 2]'), ManifestError,
     r"config.json: cannot be read as a model config", True, None, None),
    ("generation-config-not-json", _bad_config("[", "generation_config.json"), ManifestError,
     r"generation_config.json: cannot be read as a generation config", True, None, None),
    ("fractional-input-ids", None, UnsupportedError, r"'input_ids' is float32 with fractional.*pass integers",
     False, _fractional_ids, None),
    ("1d-input-ids", None, UnsupportedError, r"'input_ids' \[7\]: the export takes rank 2", False,
     _flat_ids, None),
    ("missing-mask", None, UnsupportedError, r"missing inputs \['attention_mask'\]", False, _no_mask, None),
]

CASES = [
    Case(id_, fmt, tamper or (lambda f, m: None), error, match, reseal, call, after)
    for id_, tamper, error, match, reseal, call, after in GENERIC
    for fmt in FORMATS
] + PT2_CASES + FORMAT_CASES


def test_the_table_covers_every_format():
    assert len(CASES) >= 80
    assert {c.fmt for c in CASES} == set(FORMATS)


@pytest.mark.parametrize("case", [c.param for c in CASES])
def test_security_table(case: Case, saved_exports, tmp_path):
    folder = copy_export(saved_exports(case.fmt), tmp_path / "export")
    marker = tmp_path / "pwned"
    case.tamper(folder, marker)
    if case.reseal:
        reseal(folder)
    if case.call is None:
        with pytest.raises(case.error) as info:
            ExportedModel.from_pretrained(folder)
    else:
        exported = ExportedModel.from_pretrained(folder)
        with pytest.raises(case.error) as info:
            case.call(exported, inputs())
    message = str(info.value)
    assert re.search(case.match, message, re.I | re.S), message
    assert len(message) < 8_000, f"{len(message)} characters"
    assert not marker.exists(), "the payload ran"
    if case.after is not None:
        case.after(folder, marker)


@pytest.mark.parametrize("name", sorted(PAYLOADS))
def test_each_pt2_payload_runs_in_torch_without_our_check(name, saved_exports, tmp_path):
    """The payload rows are live: torch.export.load (and the module's guard) run them when nothing checks first."""
    folder = copy_export(saved_exports("dynamo"), tmp_path / "export")
    marker = tmp_path / "pwned"
    PAYLOADS[name](folder, marker)
    register_cache_classes()  # what our loader does first, so torch gets as far as it would there
    try:
        program = torch.export.load(str(program_file(folder)))
        program.module()(**inputs())
    except Exception:  # noqa: BLE001 - the payload runs before torch fails on what it returned
        pass
    assert marker.exists(), f"{name}: the payload did not run in torch itself, so its row proves nothing"


def test_the_listed_config_wins_over_an_unlisted_config_json(saved_exports, tmp_path):
    folder = copy_export(saved_exports("dynamo"), tmp_path / "export")
    listed = json.loads((folder / "config.json").read_text())
    listed["hidden_size_marker"] = 12345
    (folder / "config.json").rename(folder / "model_config.json")
    (folder / "model_config.json").write_text(json.dumps(listed))
    (folder / "config.json").write_text(json.dumps({**listed, "hidden_size_marker": 1}))  # not in the manifest
    body = manifest(folder)
    next(e for e in body["files"] if e["path"] == "config.json")["path"] = "model_config.json"
    body["configs"]["config"] = "model_config.json"
    write_manifest(folder, body)
    reseal(folder)
    assert ExportedModel.from_pretrained(folder).config.hidden_size_marker == 12345


@pytest.mark.parametrize("name", ["./no-such-export", "/no/such/export", "~/no-such-export", "a/b/c", "a\\b"])
def test_a_local_looking_path_never_goes_to_the_hub(name, monkeypatch):
    import huggingface_hub

    def refuse(*args, **kwargs):
        raise AssertionError(f"{name!r} was looked up on the Hub")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ManifestError, match="never looked up on the Hub"):
        ExportedModel.from_pretrained(name)


def test_a_save_over_a_staging_link_removes_the_link_not_its_target(saved_exports, tmp_path):
    victim = copy_export(saved_exports("dynamo"), tmp_path / "victim")
    before = sorted(p.name for p in victim.iterdir())
    folder = copy_export(saved_exports("dynamo"), tmp_path / "export")
    (folder / ".hfexport-staging").symlink_to(victim, target_is_directory=True)
    exported = ExportedModel.from_pretrained(folder)
    exported.save_pretrained(folder)
    assert sorted(p.name for p in victim.iterdir()) == before
    assert not os.path.lexists(folder / ".hfexport-staging")


def test_an_onnx_config_is_refused_by_the_dynamo_exporter(tiny_model):
    import hfexport

    with pytest.raises(ConfigError, match=r"got OnnxConfig \(export_format 'onnx'\): use the exporter for that"):
        hfexport.DynamoExporter().export(tiny_model, inputs(), hfexport.OnnxConfig(dynamic=True))


@pytest.mark.parametrize("fmt", FORMATS)
def test_whole_float_ids_still_run_like_eager(fmt, saved_exports, tiny_model):
    """The fractional-ids row refuses only what a cast would change: whole-number floats run equal to eager."""
    sample = inputs()
    exported = ExportedModel.from_pretrained(saved_exports(fmt))
    with torch.no_grad():
        expected = tiny_model(**sample).logits
    got = exported(**{**sample, "input_ids": sample["input_ids"].float()}).logits
    assert (got - expected).abs().max().item() <= 1e-4


def test_shared_weights_the_manifest_does_not_list_are_not_read(tiny_model, tmp_path):
    """A dynamic-cache Dynamo export keeps the weights its prefill and decode share in shared_weights.safetensors;
    with that file dropped from the manifest (and resealed), loading refuses to read it."""
    import hfexport

    exported = hfexport.DynamoExporter().export_for_generation(tiny_model, inputs(), hfexport.DynamoConfig(dynamic=True))
    folder = tmp_path / "export"
    exported.save_pretrained(folder)
    assert (folder / "shared_weights.safetensors").is_file()
    ExportedModel.from_pretrained(folder)  # as saved, it loads
    body = manifest(folder)
    body["files"] = [e for e in body["files"] if e["path"] != "shared_weights.safetensors"]
    for component in body["components"].values():
        component["files"] = [f for f in component["files"] if f != "shared_weights.safetensors"]
    write_manifest(folder, body)
    with pytest.raises(ManifestError, match="its shared weights: file 'shared_weights.safetensors' is not listed"):
        ExportedModel.from_pretrained(folder)
