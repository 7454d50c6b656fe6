"""A tampered .pt2 never gets a code-executing unpickle; our own saves load with no unpickle fallback."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import pickle
import zipfile

import pytest

from hfexport import DynamoConfig, DynamoExporter, ExportedModel, ManifestError
from hfexport.testing.tiny import TINY_CASES


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _rewrite_member(path, member, data):
    entries = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            entries[info.filename] = z.read(info)
    entries[member] = data
    with zipfile.ZipFile(path, "w") as z:
        for name, payload in entries.items():
            z.writestr(name, payload)


def _reseal_manifest(directory):
    """What an attacker who controls the whole folder does: make the manifest match the tampered files."""
    manifest = json.loads((directory / "export.json").read_text())
    for entry in manifest["files"]:
        data = (directory / entry["path"]).read_bytes()
        entry["size"] = len(data)
        entry["sha256"] = hashlib.sha256(data).hexdigest()
    (directory / "export.json").write_text(json.dumps(manifest))


def test_malicious_pickle_in_sample_inputs_is_refused_before_any_unpickle(tmp_path):
    case = TINY_CASES["llama"]
    exported = DynamoExporter().export(case.build(), case.inputs(2, 7), config=DynamoConfig())
    exported.save_pretrained(tmp_path / "export")
    marker = tmp_path / "pwned"
    payload = io.BytesIO()
    pickle.dump(_Evil(str(marker)), payload, protocol=2)
    with zipfile.ZipFile(tmp_path / "export" / "model.pt2") as z:
        member = next(n for n in z.namelist() if n.endswith("sample_inputs/model.pt"))
    _rewrite_member(tmp_path / "export" / "model.pt2", member, payload.getvalue())
    _reseal_manifest(tmp_path / "export")
    with pytest.raises(ManifestError, match="a full unpickle could run code"):
        ExportedModel.from_pretrained(tmp_path / "export")
    assert not marker.exists()


@pytest.mark.parametrize("family", ["llama", "t5"])
def test_saved_generation_exports_load_without_the_unsafe_fallback(family, tmp_path, caplog):
    case = TINY_CASES[family]
    inputs = {k: v for k, v in case.inputs(2, 6).items() if not k.startswith("decoder")}
    exported = DynamoExporter().export_for_generation(case.build(), inputs, DynamoConfig(dynamic=True))
    exported.save_pretrained(tmp_path)
    with caplog.at_level(logging.WARNING):
        reloaded = ExportedModel.from_pretrained(tmp_path)
    assert "weights_only=False" not in caplog.text
    assert torch_equal(reloaded.generate(**inputs, max_new_tokens=5), exported.generate(**inputs, max_new_tokens=5))


def torch_equal(a, b):
    import torch

    return torch.equal(a, b)
