"""Dynamo exports of tiny models of every family match eager PyTorch, on new shapes and after a reload."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, ExportedModel
from hfexport.testing.tiny import TINY_CASES
from hfexport.validation import compare_outputs

from parity_cases import CASES, DEFAULT_SHAPES, SHAPES, case_params

TOL = 1e-4
# (Gemma 3's shapes stay above its window: test_shorter_than_traced_branch_is_a_clear_error covers what happens below)


@pytest.fixture(scope="module", params=case_params(CASES))
def exported_case(request, tmp_path_factory):
    case = TINY_CASES[request.param]
    model = case.build()
    inputs = case.inputs(*SHAPES.get(request.param, DEFAULT_SHAPES)[0])
    exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    return request.param, case, model, exported, tmp_path_factory.mktemp(request.param)


def _check(exported_outputs, model, inputs):
    with torch.no_grad():
        eager = model(**inputs)
    report = compare_outputs(exported_outputs, eager)
    assert not report["problems"], report["problems"]
    assert report["leaves"], "no output leaf was compared"
    assert report["max_abs_diff"] <= TOL, report["leaves"]
    return report


def test_same_inputs_match_eager(exported_case):
    name, case, model, exported, _ = exported_case
    inputs = case.inputs(*SHAPES.get(name, DEFAULT_SHAPES)[0])
    out = exported(**inputs)
    assert type(out) is type(model(**inputs)), "the export must return the model's own output type"
    _check(out, model, inputs)


def test_other_batch_and_length_match_eager(exported_case):
    name, case, model, exported, _ = exported_case
    inputs = case.inputs(*SHAPES.get(name, DEFAULT_SHAPES)[1])
    assert inputs[next(iter(inputs))].shape != case.inputs(*SHAPES.get(name, DEFAULT_SHAPES)[0])[next(iter(inputs))].shape
    _check(exported(**inputs), model, inputs)


def test_reload_matches_eager(exported_case):
    name, case, model, exported, tmp = exported_case
    exported.save_pretrained(tmp)
    reloaded = ExportedModel.from_pretrained(tmp)
    inputs = case.inputs(*SHAPES.get(name, DEFAULT_SHAPES)[2])
    _check(reloaded(**inputs), model, inputs)
    assert reloaded.components["model"].metadata.to_dict() == exported.components["model"].metadata.to_dict()


def test_mamba_export_keeps_sequence_symbolic_through_the_scan_workaround():
    case = TINY_CASES["mamba"]
    exported = DynamoExporter().export(case.build(), case.inputs(2, 7), config=DynamoConfig(dynamic=True))
    metadata = exported.components["model"].metadata
    assert "mamba-symbolic-scan" in metadata.workarounds
    assert isinstance(metadata.inputs[0].shape[1], str), metadata.inputs[0].shape


def test_shorter_than_traced_branch_is_a_clear_error():
    from hfexport.errors import UnsupportedError

    case = TINY_CASES["gemma3"]
    model = case.build()
    exported = DynamoExporter().export(model, case.inputs(2, 10), config=DynamoConfig(dynamic=True))
    with pytest.raises(UnsupportedError, match="outside the shapes this export accepts"):
        exported(**case.inputs(1, 5))
