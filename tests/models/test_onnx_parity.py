"""ONNX exports of tiny models of every family match eager PyTorch on ONNX Runtime (CPU), with and without fusions.

Each case is checked on the export's own shapes, on another batch size and sequence length, and after a save and
reload. fp32 tolerance: max abs diff <= 1e-4 over every output leaf (logits, hidden states, caches).
"""

from __future__ import annotations

import pytest
import torch

from hfexport import ExportedModel, OnnxConfig
from hfexport.exporter_onnx import OnnxExporter
from hfexport.models.tiny import TINY_CASES
from hfexport.validation import compare_outputs

TOL = 1e-4
CASES = ["llama", "qwen3", "gpt2", "gemma3", "mixtral", "qwen3_moe", "bert", "t5", "vit", "whisper", "mamba"]
# fused for the CPU: the families whose graphs hold what the fusions rewrite (RMSNorm, LayerNorm, GELU, rotary,
# sibling projections); attention over a cache fuses only at batch 1 or a single query token (test_generate_onnx)
FUSED = ["llama", "qwen3", "gemma3", "gpt2", "bert"]
# (batch, seq) of the export sample, of the "other shape" run and of the reload run; as in test_dynamo_parity
SHAPES = {"gemma3": ((2, 10), (3, 12), (1, 9))}
DEFAULT_SHAPES = ((2, 7), (3, 10), (1, 5))
# T5's tiny config (initializer_factor=3) is ill-conditioned: eager fp32 itself is ~1e-3 away from fp64 on its
# logits. For it the export must be at least as close to the fp64 result as eager fp32 is.
ILL_CONDITIONED = {"t5"}


@pytest.fixture(scope="module", params=[(n, None) for n in CASES] + [(n, "cpu") for n in FUSED],
                ids=lambda p: f"{p[0]}-{p[1] or 'plain'}")
def exported_case(request, tmp_path_factory):
    name, fusions = request.param
    case = TINY_CASES[name]
    model = case.build()
    inputs = case.inputs(*SHAPES.get(name, DEFAULT_SHAPES)[0])
    exported = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True, ort_fusions=fusions))
    return name, case, model, exported, tmp_path_factory.mktemp(f"{name}-{fusions}")


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
        return report
    assert report["max_abs_diff"] <= TOL, report["leaves"]
    return report


def test_same_inputs_match_eager(exported_case):
    name, case, model, exported, _ = exported_case
    inputs = case.inputs(*SHAPES.get(name, DEFAULT_SHAPES)[0])
    out = exported(**inputs)
    assert type(out) is type(model(**inputs)), "the export must return the model's own output type"
    _check(name, out, model, inputs)


def test_other_batch_and_length_match_eager(exported_case):
    name, case, model, exported, _ = exported_case
    shapes = SHAPES.get(name, DEFAULT_SHAPES)
    inputs = case.inputs(*shapes[1])
    first = next(iter(inputs))
    assert inputs[first].shape != case.inputs(*shapes[0])[first].shape
    _check(name, exported(**inputs), model, inputs)


def test_reload_matches_eager(exported_case):
    name, case, model, exported, tmp = exported_case
    exported.save_pretrained(tmp)
    reloaded = ExportedModel.from_pretrained(tmp)
    inputs = case.inputs(*SHAPES.get(name, DEFAULT_SHAPES)[2])
    _check(name, reloaded(**inputs), model, inputs)
    assert reloaded.components["model"].metadata.to_dict() == exported.components["model"].metadata.to_dict()


def test_only_fused_graphs_use_onnx_runtime_ops(exported_case):
    name, _, _, exported, _ = exported_case
    ops = {(n.domain, n.op_type) for n in exported.program.graph}
    contrib = {op for domain, op in ops if domain == "com.microsoft"}
    if exported.components["model"].metadata.export_config["ort_fusions"] is None:
        assert not contrib, f"a plain export must run on any ONNX runtime: {contrib}"
        return
    layer_norm = name in ("gpt2", "bert")
    assert ("SkipLayerNormalization" if layer_norm else "SkipSimplifiedLayerNormalization") in contrib, sorted(ops)
    if not layer_norm:
        assert "RotaryEmbedding" in contrib


def test_t5_is_ill_conditioned_in_fp32_eager_itself():
    """Why T5 is compared against fp64: eager fp32 alone misses the fp64 logits by more than the tolerance."""
    case = TINY_CASES["t5"]
    inputs = case.inputs(2, 7)
    with torch.no_grad():
        error = compare_outputs(case.build()(**inputs), case.build().double()(**inputs))["max_abs_diff"]
    assert error > TOL
