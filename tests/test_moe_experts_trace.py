"""MoE experts whose forward loops over the experts hit (``nonzero()`` of the routing mask), which failed every trace
with ``GuardOnDataDependentSymNode: Eq(u0, 0)`` before (issue 22): experts that transformers resolves to its
``eager`` loop (``grouped_mm`` cannot dispatch for OpenAI's privacy filter, with transposed weights and biases) trace
as ``batched_mm`` on every backend (workaround ``moe-eager-batched-mm``); DBRX's own experts class as batched
matmuls (``dbrx-batched-experts``)."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig
from hfexport.exporter_dynamo import DynamoExporter
from hfexport.tools.matrix.inputs import sample_inputs
from hfexport.tools.matrix.shrink import build_model


def test_eager_moe_experts_export_as_batched_mm_and_the_models_choice_is_put_back():
    model = build_model("openai_privacy_filter", "OpenAIPrivacyFilterForTokenClassification")
    assert model.config._experts_implementation_internal == "eager"
    inputs = sample_inputs(model, "openai_privacy_filter")
    with torch.no_grad():
        expected = model(**inputs).logits
    exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    assert "moe-eager-batched-mm" in exported.components["model"].metadata.workarounds
    assert model.config._experts_implementation_internal == "eager", "the model's own choice is put back"
    other = sample_inputs(model, "openai_privacy_filter", batch=1, seq=11)
    with torch.no_grad():
        other_expected = model(**other).logits
    assert (exported(**inputs).logits - expected).abs().max() < 1e-4
    assert (exported(**other).logits - other_expected).abs().max() < 1e-4


def test_dbrx_experts_trace_without_their_loop_over_the_experts_hit():
    """DBRX's own experts class (workaround ``dbrx-batched-experts``)."""
    from transformers.models.dbrx import modeling_dbrx

    forward = modeling_dbrx.DbrxExperts.forward
    model = build_model("dbrx", "DbrxForCausalLM")
    inputs = sample_inputs(model, "dbrx")
    exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    assert "dbrx-batched-experts" in exported.components["model"].metadata.workarounds
    assert modeling_dbrx.DbrxExperts.forward is forward, "the model's own forward is put back"
    for batch, seq in ((2, 6), (1, 13)):
        sample = sample_inputs(model, "dbrx", batch=batch, seq=seq)
        with torch.no_grad():
            expected = model(**sample).logits
        assert (exported(**sample).logits - expected).abs().max() < 1e-4


def test_the_switch_reaches_a_language_model_inside_a_model_that_cannot_switch_and_is_put_back():
    """Nemotron-H Omni (below, exported in the sweep): the composite refuses the switch, its language model takes it."""
    from hfexport.workarounds import applied_workarounds

    model = build_model("nemotron_h_omni", "NemotronH_Omni_Reasoning_V3")
    assert not model._can_set_experts_implementation()  # (the premise: the top model refuses the switch)
    language = model.language_model
    assert language.config._experts_implementation_internal == "grouped_mm"
    with applied_workarounds("openvino", model, {}) as fired:
        assert "openvino-moe-batched-mm" in fired
        assert language.config._experts_implementation_internal == "batched_mm"
    assert language.config._experts_implementation_internal == "grouped_mm"


@pytest.mark.sweep
def test_grouped_mm_experts_of_a_language_model_inside_a_model_that_cannot_switch_run_as_batched_mm_on_openvino():
    """Nemotron-H Omni: its RADIO vision tower cannot switch experts implementations, so the composite says it cannot
    as a whole, while its Nemotron-H language model resolved grouped_mm (aten.histc and grouped_mm_fallback, which
    OpenVINO's frontend and ExecuTorch's edge verifier refuse). The switch reaches the language model."""
    from hfexport import OpenVINOConfig
    from hfexport.exporter_openvino import OpenVINOExporter

    model = build_model("nemotron_h_omni", "NemotronH_Omni_Reasoning_V3")
    assert not model._can_set_experts_implementation()  # (the premise: the top model refuses the switch)
    language = model.language_model
    assert language.config._experts_implementation_internal == "grouped_mm"
    inputs = sample_inputs(model, "nemotron_h_omni")
    with torch.no_grad():
        expected = model(**inputs).logits
    exported = OpenVINOExporter().export(model, inputs, config=OpenVINOConfig(dynamic=True))
    assert "openvino-moe-batched-mm" in exported.components["model"].metadata.workarounds
    assert language.config._experts_implementation_internal == "grouped_mm", "the model's own choice is put back"
    assert (exported(**inputs).logits - expected).abs().max() < 1e-3


@pytest.mark.sweep  # (matrix-family regressions, 30-40 s each: the matrix's rows run them too)
@pytest.mark.parametrize("model_type", ["dbrx", "longcat_flash"])
def test_batched_experts_decode_a_token_a_row_on_openvino_like_eager(model_type):
    """Their batched experts took each token's k choices as an expand(tokens, k, -1) reshaped to [T*k, 1, H]: in the
    single-token decode graph OpenVINO's frontend refused DBRX's ("Incompatible MatMul matrix dimension"), and its CPU
    plugin LongCat-Flash's Select at run time. With each token repeated per choice (repeat_interleave; DBRX's as a
    column, LongCat-Flash's as a row: see longcat-flash-batched-experts) both generate like eager."""
    from hfexport.tools.matrix.discovery import discover
    from hfexport.tools.matrix.worker import run_case

    (arch,) = discover([f"={model_type}"])
    row = run_case(arch.model_type, arch.class_name, arch.task, "openvino", "generate")
    assert row["status"] == "pass" and row["mismatched_tokens"] == 0, row["reason"]
