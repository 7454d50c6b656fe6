"""``hfexport.validate``: every output leaf against eager PyTorch, generation token for token, and a report that
fails, naming the leaf or the row, when the export and the model differ.

The exports are of tiny seeded random-weight models; the failing cases validate an export against a copy of its
model with one weight moved by +0.5 (a copy: a Dynamo export shares the model's parameter storage, so changing the
model itself would change the export too).
"""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch

import hfexport
from hfexport import DynamoConfig, DynamoExporter, ExportedModel
from hfexport.testing.tiny import PAD_ID, TINY_CASES
from hfexport.validation import LeafReport, ValidationReport, compare_outputs, tolerance, validate

LLAMA = TINY_CASES["llama"]


def _changed(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with one weight of its first MLP moved by +0.5."""
    changed = copy.deepcopy(model)
    with torch.no_grad():
        changed.model.layers[0].mlp.down_proj.weight[0, 0] += 0.5
    return changed


@pytest.fixture(scope="module")
def llama():
    return LLAMA.build()


@pytest.fixture(scope="module")
def inputs():
    return LLAMA.inputs(2, 8)  # row 0 left-padded by two positions


@pytest.fixture(scope="module", params=["dynamo", "onnx"])
def single(request, llama, inputs):
    if request.param == "dynamo":
        return DynamoExporter().export(llama, inputs, DynamoConfig(dynamic=True))
    pytest.importorskip("onnxruntime")
    from hfexport import OnnxConfig, OnnxExporter

    return OnnxExporter().export(llama, inputs, OnnxConfig(dynamic=True))


# --- the tolerance table -----------------------------------------------------------------------------------------


def test_tolerance_is_by_dtype_and_backend():
    assert tolerance(torch.float32, "dynamo") == (1e-4, 0.0)
    assert tolerance(torch.float32, "onnx") == (1e-4, 0.0)
    assert tolerance(torch.float32, "executorch") == tolerance(torch.float32, "openvino") == (1e-3, 0.0)
    assert tolerance(torch.float16, "dynamo") == (1e-2, 1e-2)
    assert tolerance(torch.bfloat16, "onnx") == (5e-2, 5e-2)
    assert tolerance(torch.int64, "openvino") == tolerance(torch.bool) == (0.0, 0.0)
    assert tolerance(torch.float32, "onnx", quantized=True) is None
    assert tolerance(torch.int64, "onnx", quantized=True) == (0.0, 0.0)  # ids stay exact in a quantized export


# --- single-graph exports ----------------------------------------------------------------------------------------


def test_export_passes_with_every_leaf_within_1e_4(single, llama, inputs):
    report = validate(single, llama, inputs)
    assert report.passed, str(report)
    assert report.problems == [] and report.generation is None
    # the report's numbers are eager PyTorch's against the export's, recomputed here
    with torch.no_grad():
        want = llama(**inputs)
    got = single(**inputs)
    logits = report.leaves["logits"]
    assert logits.max_abs_diff == pytest.approx(float((got.logits - want.logits).abs().max()), abs=1e-12)
    assert logits.max_abs_diff <= 1e-4 and logits.atol == 1e-4 and logits.shape == [2, 8, 256]
    assert set(report.leaves) == {"logits", *(f"past_key_values.layers.{i}.{kv}" for i in (0, 1)
                                              for kv in ("keys", "values"))}
    assert all(leaf.passed and leaf.max_abs_diff <= 1e-4 for leaf in report.leaves.values())
    assert str(report).startswith(f"validation passed ({single.export_format})")


def test_a_changed_weight_fails_and_names_the_leaf(single, llama, inputs):
    changed = _changed(llama)
    with torch.no_grad():
        moved = float((changed(**inputs).logits - llama(**inputs).logits).abs().max())
    assert moved > 1e-2  # the change is visible in eager's own logits
    report = validate(single, changed, inputs)
    assert not report.passed
    logits = report.leaves["logits"]
    assert not logits.passed and logits.max_abs_diff == pytest.approx(moved, rel=1e-3)
    # layer 0's cache is computed before the changed MLP weight is used: it still matches
    assert report.leaves["past_key_values.layers.0.keys"].passed
    text = str(report)
    assert text.startswith("validation FAILED")
    failing = [line for line in text.splitlines()[1:]]
    assert any(line.strip().startswith("logits: max abs diff") for line in failing), text
    assert len(failing) == sum(not leaf.passed for leaf in report.leaves.values())


def test_atol_and_rtol_replace_the_table(single, llama, inputs):
    changed = _changed(llama)
    assert not validate(single, changed, inputs).passed
    loose = validate(single, changed, inputs, atol=1.0)
    assert loose.passed and loose.leaves["logits"].atol == 1.0
    relative = validate(single, changed, inputs, atol=0.0, rtol=1e6)
    assert relative.passed and relative.leaves["logits"].rtol == 1e6
    strict = validate(single, llama, inputs, atol=0.0)
    assert strict.leaves["logits"].atol == 0.0  # held to exact equality: passes only where the backend is exact
    assert strict.leaves["logits"].passed == (strict.leaves["logits"].max_abs_diff == 0.0)


def test_the_report_is_json(single, llama, inputs):
    report = validate(single, _changed(llama), inputs)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["passed"] is False and data["export_format"] == str(single.export_format)
    assert data["leaves"]["logits"]["passed"] is False
    assert data["leaves"]["logits"]["max_abs_diff"] == report.leaves["logits"].max_abs_diff
    assert data["generation"] is None and data["problems"] == []


def test_reloaded_export_validates(single, llama, inputs, tmp_path):
    single.save_pretrained(tmp_path / "saved")
    assert hfexport.validate(ExportedModel.from_pretrained(tmp_path / "saved"), llama, inputs).passed


# --- leaves that cannot be compared, and NaN ---------------------------------------------------------------------


class _FakeExport:
    """An export-shaped object whose outputs are given: to put missing leaves and NaNs in front of validate()."""

    export_format = "dynamo"

    def __init__(self, outputs):
        from types import SimpleNamespace

        self.outputs = outputs
        self.components = {"model": SimpleNamespace(metadata=SimpleNamespace(export_config={}))}

    def __call__(self, **kwargs):
        return self.outputs


def test_missing_leaf_and_shape_mismatch_are_problems():
    eager = {"logits": torch.ones(2, 3), "hidden": torch.ones(2), "extra_ids": torch.arange(3)}
    model = lambda **kw: eager  # noqa: E731
    report = validate(_FakeExport({"logits": torch.ones(2, 3), "hidden": torch.ones(3), "other": torch.ones(1)}),
                      model, {})
    assert not report.passed
    assert report.leaves["logits"].passed
    assert "hidden: shape (3,) != eager (2,)" in report.problems
    assert "extra_ids: in eager's outputs, missing from the export's" in report.problems
    assert "other: in the export's outputs, not in eager's" in report.problems
    assert "problem: hidden: shape" in str(report)
    # compare_outputs (the bare numbers) keeps its old contract: no verdict, extras ignored
    bare = compare_outputs({"logits": torch.ones(2, 3) + 1e-3}, {"logits": torch.ones(2, 3)})
    assert bare["max_abs_diff"] == pytest.approx(1e-3, rel=1e-4) and bare["problems"] == []


def test_nan_agrees_only_in_the_same_place():
    nan = float("nan")
    model = lambda **kw: {"logits": torch.tensor([1.0, nan, float("inf")])}  # noqa: E731
    same = validate(_FakeExport({"logits": torch.tensor([1.0, nan, float("inf")])}), model, {})
    assert same.passed and same.leaves["logits"].max_abs_diff == 0.0
    moved = validate(_FakeExport({"logits": torch.tensor([nan, 1.0, float("inf")])}), model, {})
    assert not moved.passed and math.isnan(moved.leaves["logits"].max_abs_diff)
    assert json.loads(json.dumps(moved.to_dict()))["leaves"]["logits"]["max_abs_diff"] == "nan"


def test_integer_leaves_must_be_equal():
    model = lambda **kw: {"ids": torch.tensor([3, 4, 5])}  # noqa: E731
    assert validate(_FakeExport({"ids": torch.tensor([3, 4, 5])}), model, {}).passed
    report = validate(_FakeExport({"ids": torch.tensor([3, 4, 6])}), model, {}, atol=10.0)  # atol is for floats
    assert not report.passed and report.leaves["ids"].max_abs_diff == 1.0 and report.leaves["ids"].atol == 0.0


def test_leaf_report_line_names_the_leaf():
    leaf = LeafReport("logits", "float32", [1, 2], 0.5, 2.0, 1e-4, 0.0, False)
    report = ValidationReport(passed=False, export_format="onnx", leaves={"logits": leaf})
    assert str(report).splitlines()[1].strip().startswith("logits: max abs diff 0.5 exceeds atol 0.0001")


# --- generation exports ------------------------------------------------------------------------------------------


def _static_export(model, max_cache_len: int) -> ExportedModel:
    from transformers import GenerationConfig

    gen = GenerationConfig(cache_implementation="static", max_cache_len=max_cache_len, do_sample=False)
    return DynamoExporter().export_for_generation(model, LLAMA.inputs(2, 6), DynamoConfig(dynamic=True),
                                                  generation_config=gen, multi_token_decode=True)


@pytest.fixture(scope="module")
def generation_export(llama):
    return _static_export(llama, 48)


def _eager_batch(model, inputs, new_tokens: int) -> torch.Tensor:
    """What validate() should run: row 0's tokens, and their second half left-padded with the pad id."""
    first = inputs["input_ids"][0][inputs["attention_mask"][0].bool()]
    second = first[first.numel() // 2 :]
    pad = torch.full((first.numel() - second.numel(),), PAD_ID)
    ids = torch.stack([first, torch.cat([pad, second])])
    mask = (torch.arange(ids.shape[1]) >= pad.numel()).long().expand(2, -1).clone()
    mask[0] = 1
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False)
    return out[:, ids.shape[1] :]


def test_generation_matches_eager_on_a_padded_batch_of_2(generation_export, llama, inputs):
    assert {"prefill", "decode"} <= set(generation_export.components)
    report = validate(generation_export, llama, inputs)
    assert report.passed, str(report)
    gen = report.generation
    assert gen.prompt_lengths == [6, 3] and gen.max_new_tokens == 16
    expected = _eager_batch(llama, inputs, 16).tolist()
    assert gen.eager_tokens == expected and gen.exported_tokens == expected
    assert gen.first_difference == [None, None]
    # the teacher-forced logits: the last prompt position, then every decode step
    assert report.leaves["prefill.logits"].shape == [2, 256] and report.leaves["decode.logits"].shape == [15, 2, 256]
    assert all(leaf.max_abs_diff <= 1e-4 for leaf in report.leaves.values())
    assert "generation: 2 of 2 rows give eager's 16 greedy tokens" in str(report)


def test_generation_with_a_changed_weight_names_the_first_differing_position(generation_export, llama, inputs):
    changed = _changed(llama)
    moved = _eager_batch(changed, inputs, 16)
    assert moved.tolist() != _eager_batch(llama, inputs, 16).tolist()  # the change shows in eager's tokens
    report = validate(generation_export, changed, inputs)
    assert not report.passed
    gen = report.generation
    assert gen.eager_tokens == moved.tolist()
    for row, first in enumerate(gen.first_difference):
        eager, got = gen.eager_tokens[row], gen.exported_tokens[row]
        expected = next((i for i, (a, b) in enumerate(zip(eager, got)) if a != b), None)
        assert first == expected
    assert any(first is not None for first in gen.first_difference)
    row = next(r for r, first in enumerate(gen.first_difference) if first is not None)
    assert f"generation row {row}: first differing token at new position {gen.first_difference[row]}" in str(report)
    assert not report.leaves["prefill.logits"].passed and not report.leaves["decode.logits"].passed
    data = json.loads(json.dumps(report.to_dict()))
    assert data["generation"]["first_difference"] == gen.first_difference


def test_generation_is_capped_by_the_static_cache(llama, inputs):
    report = validate(_static_export(llama, 12), llama, inputs)
    assert report.passed, str(report)
    assert report.generation.max_new_tokens == 12 - 6  # prompt 6 + 6 new tokens fill the 12 cache positions
    assert report.generation.eager_tokens == _eager_batch(llama, inputs, 6).tolist()


def test_generation_decodes_past_the_sliding_window():
    from transformers import Gemma3ForCausalLM

    from hfexport.testing.tiny_multimodal import instantiate

    window = 24
    config = copy.deepcopy(TINY_CASES["gemma3"].build().config)
    config.sliding_window = window
    model = instantiate(Gemma3ForCausalLM, config)
    inputs = TINY_CASES["gemma3"].inputs(2, 8)
    # the window changes eager's logits past it: decoding that far tests what a window does
    ids = torch.randint(3, 248, (1, window + 8), generator=torch.Generator().manual_seed(0))
    wide = copy.deepcopy(config)
    wide.sliding_window = 4 * window
    with torch.no_grad():
        near, far = model(input_ids=ids).logits, instantiate(Gemma3ForCausalLM, wide)(input_ids=ids).logits
    assert torch.allclose(near[:, :window], far[:, :window], atol=1e-5)
    assert (near[:, window:] - far[:, window:]).abs().max() > 1e-3
    exported = DynamoExporter().export_for_generation(model, TINY_CASES["gemma3"].inputs(2, 6),
                                                      DynamoConfig(dynamic=True))
    report = validate(exported, model, inputs)
    assert report.passed, str(report)
    gen = report.generation
    assert gen.max_new_tokens == window + 8 - 6  # prompt 6: 26 new tokens end 8 positions past the window
    assert max(gen.prompt_lengths) + gen.max_new_tokens > window
    assert gen.eager_tokens == _eager_batch(model, inputs, gen.max_new_tokens).tolist()


def test_generate_on_a_single_graph_export_is_refused(single, llama, inputs):
    from hfexport.errors import UnsupportedError

    with pytest.raises(UnsupportedError, match="export_for_generation"):
        validate(single, llama, inputs, generate=True)


def test_generate_false_keeps_only_the_teacher_forced_logits(generation_export, llama, inputs):
    changed = _changed(llama)
    report = validate(generation_export, changed, inputs, generate=False)
    assert report.generation is None and set(report.leaves) == {"prefill.logits", "decode.logits"}
    assert not report.passed and not report.leaves["decode.logits"].passed
    assert validate(generation_export, llama, inputs, generate={"max_new_tokens": 4}).generation.max_new_tokens == 4
