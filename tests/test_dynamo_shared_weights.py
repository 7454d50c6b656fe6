"""A dynamic-cache Dynamo export (prefill + decode programs) stores the weights once, and loads them once."""

from __future__ import annotations

import json
import zipfile

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, ExportedModel
from hfexport.errors import ManifestError
from hfexport.testing.tiny import TINY_CASES


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    case = TINY_CASES["llama"]
    model = case.build()
    exported = DynamoExporter().export_for_generation(model, case.inputs(2, 6), DynamoConfig(dynamic=True))
    directory = tmp_path_factory.mktemp("dyn")
    exported.save_pretrained(directory)
    return case, model, directory


def test_weights_are_stored_once_and_shared_in_memory(saved):
    case, model, directory = saved
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    programs = sorted(p.name for p in directory.glob("*.pt2"))
    assert programs == ["decode.pt2", "prefill.pt2"]
    shared = (directory / "shared_weights.safetensors").stat().st_size
    assert weights <= shared <= 1.01 * weights + 4096  # every weight, once (tied embedding/lm_head included)
    for name in programs:  # each archive keeps its graph and constants; its weight records are placeholders
        with zipfile.ZipFile(directory / name) as archive:
            stored = sum(i.file_size for i in archive.infolist() if "/data/weights/weight_" in f"/{i.filename}")
        assert stored <= 0.01 * weights, (name, stored)
    manifest = json.loads((directory / "export.json").read_text())
    assert manifest["components"]["decode"]["files"] == ["decode.pt2", "shared_weights.safetensors"]

    reloaded = ExportedModel.from_pretrained(directory)
    prefill, decode = (reloaded.components[n].program for n in ("prefill", "decode"))
    assert all(prefill.state_dict[k] is decode.state_dict[k] for k in prefill.state_dict)  # one copy in memory
    for fqn, value in decode.state_dict.items():
        assert torch.equal(value, dict(model.named_parameters())[fqn]), fqn
    prompt = case.inputs(3, 9)
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=10, do_sample=False)
    assert torch.equal(reloaded.generate(**prompt, max_new_tokens=10, do_sample=False), expected)


def test_a_record_naming_another_file_is_refused(saved, tmp_path):
    _, _, directory = saved
    from hfexport.backends.dynamo import shared_weights

    path = directory / "decode.pt2"
    with zipfile.ZipFile(path) as archive:
        member = next(n for n in archive.namelist() if n.endswith(shared_weights.EXTRA_FILE))
        record = json.loads(archive.read(member))
    program = DynamoExporter().load_program(path)
    for bad, message in (({**record, "file": "../../etc/passwd"}, "only 'shared_weights.safetensors'"),
                         ({**record, "tensors": {"model.norm.weight": "w0"}}, "the program expects")):
        with pytest.raises(ManifestError, match=message):
            shared_weights.attach_shared(program, path, json.dumps(bad), {})
