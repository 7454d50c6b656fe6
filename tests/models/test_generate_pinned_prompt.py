"""Models whose code loops over the sequence in Python: tracing fixes (or bounds) the prefill's prompt length.

generate() then prefills the tokens the graph takes and feeds the rest of the prompt through the decode graph, a
token a call, as recurrent runtimes prefill: the tokens equal eager's on a left-padded batch whose prompt is longer
than the capture's. A model that keeps its recurrent state on its modules is refused at export, with the reason.
"""

from __future__ import annotations

import copy

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, UnsupportedError
from hfexport.tools.matrix.inputs import sample_inputs
from hfexport.tools.matrix.shrink import build_model

CAPTURE, PROMPT, NEW = 6, 9, 10

# model type -> its causal LM class; where the length comes from
CASES = {
    # falcon_mamba's slow path loops over the sequence (modeling_falcon_mamba.py: ``for i in range(seq_len)``)
    "falcon_mamba": "FalconMambaForCausalLM",
    # Jamba: Mamba layers (the same loop) beside attention layers with a growing KV cache
    "jamba": "JambaForCausalLM",
    # LFM3's short convolution branches on the length: the trace bounds it (``s <= 6``) instead of fixing it
    "lfm3": "Lfm3ForCausalLM",
}


def _generation(model):
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample = False
    return gen


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_a_prompt_longer_than_the_traced_one_generates_like_eager(model_type):
    torch.manual_seed(0)
    model = build_model(model_type, CASES[model_type])
    sample = sample_inputs(model, model_type, batch=2, seq=CAPTURE, for_generation=True)
    prompt = sample_inputs(model, model_type, batch=2, seq=PROMPT, for_generation=True)
    assert not bool(prompt["attention_mask"].all()), "the prompt batch is left-padded"
    exported = DynamoExporter().export_for_generation(model, sample, DynamoConfig(dynamic=True),
                                                      generation_config=_generation(model))
    # the prefill graph takes at most the capture's length: the rest of the prompt goes through the decode graph
    limit = exported.components["prefill"].metadata.query_limit()
    assert limit is not None and limit < PROMPT, limit
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(prompt), generation_config=_generation(model),
                                  max_new_tokens=NEW, min_new_tokens=NEW)
    got = exported.generate(**prompt, max_new_tokens=NEW, min_new_tokens=NEW)
    assert torch.equal(got, expected), (got, expected)


def test_the_bound_a_trace_leaves_survives_save_and_load(tmp_path):
    from hfexport import ExportedModel

    torch.manual_seed(0)
    model = build_model("lfm3", CASES["lfm3"])
    sample = sample_inputs(model, "lfm3", batch=2, seq=CAPTURE, for_generation=True)
    exported = DynamoExporter().export_for_generation(model, sample, DynamoConfig(dynamic=True),
                                                      generation_config=_generation(model))
    metadata = exported.components["prefill"].metadata
    axis = metadata.query_axis(("input_ids",))
    assert isinstance(axis, str) and metadata.dim_ranges[axis][1] == CAPTURE, metadata.dim_ranges
    exported.save_pretrained(tmp_path / "lfm3")
    loaded = ExportedModel.from_pretrained(tmp_path / "lfm3")
    assert loaded.components["prefill"].metadata.query_limit() == CAPTURE


def test_a_model_that_keeps_its_state_on_its_modules_is_refused_at_export():
    # RecurrentGemma keeps its conv and recurrent states as attributes of its modules (modeling_recurrent_gemma.py
    # ``_setup_cache``): its output returns no cache, so an export cannot carry the state between calls
    torch.manual_seed(0)
    model = build_model("recurrent_gemma", "RecurrentGemmaForCausalLM")
    sample = sample_inputs(model, "recurrent_gemma", batch=2, seq=CAPTURE, for_generation=True)
    with pytest.raises(UnsupportedError, match="keeps its recurrent state on its own modules") as info:
        DynamoExporter().export_for_generation(model, sample, DynamoConfig(dynamic=True),
                                               generation_config=_generation(model))
    assert "RecurrentGemmaForCausalLM" in str(info.value)
