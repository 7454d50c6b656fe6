"""A multimodal model whose encoders hfexport does not split out (Fuyu): generate() runs its modality encoding before
the first forward and passes the result as ``mm_encoder_outputs`` (an empty dict for a text prompt), which a caller
of the export never has; the exported prefill takes the processor's inputs instead (image ones when given)."""

from __future__ import annotations

import warnings

import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.tools.matrix.inputs import sample_inputs
from hfexport.tools.matrix.shrink import build_model


def test_fuyu_prefill_takes_the_processor_inputs_and_generates_eagers_tokens():
    torch.manual_seed(0)
    model = build_model("fuyu", "FuyuForCausalLM")
    capture = sample_inputs(model, "fuyu", batch=2, seq=6, for_generation=True)
    prompt = sample_inputs(model, "fuyu", batch=2, seq=9, for_generation=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = DynamoExporter().export_for_generation(model, capture, DynamoConfig(dynamic=True))
    traced = set(exported.components["prefill"].metadata.kwargs)
    assert "mm_encoder_outputs" not in traced and {"input_ids", "attention_mask"} <= traced
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(exported.generate(**prompt, max_new_tokens=6), expected)
