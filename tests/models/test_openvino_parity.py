"""OpenVINO exports of tiny models of every family match eager PyTorch on OpenVINO Runtime (CPU, fp32).

Each case is exported once and checked on the export's own shapes, on another batch size and sequence length, and
after a save and reload (``openvino_model.xml`` / ``.bin``). fp32 tolerance: max abs diff <= 1e-3 over every output
leaf (logits, hidden states, caches). The runner compiles an fp32 export with an f32 precision hint: the CPU plugin's
default on this processor is bf16, which misses the tolerance (checked in tests/test_openvino_backend.py).
"""

from __future__ import annotations

import pytest
import torch

from hfexport import ExportedModel, OpenVINOConfig
from hfexport.exporter_openvino import OpenVINOExporter
from hfexport.models.tiny import TINY_CASES
from hfexport.validation import compare_outputs

TOL = 1e-3
CASES = ["llama", "qwen3", "gpt2", "gemma3", "mixtral", "qwen3_moe", "bert", "t5", "vit", "whisper", "mamba"]
SHAPES = {"gemma3": ((2, 10), (3, 12), (1, 9))}
DEFAULT_SHAPES = ((2, 7), (3, 10), (1, 5))
# T5's tiny config is ill-conditioned: eager fp32 itself is ~1e-3 away from fp64 (tests/models/test_onnx_parity.py)
ILL_CONDITIONED = {"t5"}


@pytest.fixture(scope="module", params=CASES)
def exported_case(request, tmp_path_factory):
    name = request.param
    case = TINY_CASES[name]
    model = case.build()
    inputs = case.inputs(*SHAPES.get(name, DEFAULT_SHAPES)[0])
    exported = OpenVINOExporter().export(model, inputs, config=OpenVINOConfig(dynamic=True))
    return name, case, model, exported, tmp_path_factory.mktemp(name)


def _check(name, exported_outputs, model, inputs):
    with torch.no_grad():
        eager = model(**inputs)
    report = compare_outputs(exported_outputs, eager)
    assert not report["problems"], report["problems"]
    assert report["leaves"], "no output leaf was compared"
    if name in ILL_CONDITIONED:
        with torch.no_grad():
            exact = TINY_CASES[name].build().double()(**inputs)
        eager_error = compare_outputs(eager, exact)["max_abs_diff"]
        assert compare_outputs(exported_outputs, exact)["max_abs_diff"] <= max(TOL, eager_error), report["leaves"]
        return
    assert report["max_abs_diff"] <= TOL, report["leaves"]


def test_same_other_shapes_and_reload_match_eager(exported_case):
    name, case, model, exported, tmp = exported_case
    shapes = SHAPES.get(name, DEFAULT_SHAPES)
    inputs = case.inputs(*shapes[0])
    out = exported(**inputs)
    assert type(out) is type(model(**inputs)), "the export must return the model's own output type"
    _check(name, out, model, inputs)

    other = case.inputs(*shapes[1])
    first = next(iter(other))
    assert other[first].shape != inputs[first].shape
    _check(name, exported(**other), model, other)

    exported.save_pretrained(tmp)
    assert (tmp / "openvino_model.xml").is_file() and (tmp / "openvino_model.bin").is_file()
    reloaded = ExportedModel.from_pretrained(tmp)
    again = case.inputs(*shapes[2])
    _check(name, reloaded(**again), model, again)
    assert reloaded.components["model"].metadata.to_dict() == exported.components["model"].metadata.to_dict()
