"""MoE experts that transformers resolves to its ``eager`` loop (``grouped_mm`` cannot dispatch for the model: OpenAI's
privacy filter, with transposed weights and biases) trace as ``batched_mm`` on every backend (workaround
``moe-eager-batched-mm``). Before (issue 22), the eager loop over the experts hit failed every trace with
``GuardOnDataDependentSymNode: Eq(u0, 0)``."""

from __future__ import annotations

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
