"""The real packaged models (SmolLM2-135M-Instruct, all-MiniLM-L6-v2) export on Dynamo and match eager."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, ExportedModel
from hfexport.testing.packaged import packaged
from hfexport.validation import compare_outputs

PROMPTS = ["The capital of France is", "Write a short poem about the sea and the sky."]


@pytest.fixture(scope="module")
def smollm2():
    return packaged("smollm2")


def _encode(tokenizer, prompts):
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    enc = tokenizer(prompts, padding=True, return_tensors="pt")
    return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def test_smollm2_logits_match_eager_and_survive_a_reload(smollm2, tmp_path):
    model, tokenizer = smollm2
    inputs = _encode(tokenizer, PROMPTS)
    exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    with torch.no_grad():
        eager = model(**inputs)
    report = compare_outputs(exported(**inputs), eager)
    assert report["max_abs_diff"] <= 1e-4, report["leaves"]["logits"]
    exported.save_pretrained(tmp_path)
    other = _encode(tokenizer, ["Hello"])  # another batch size and length
    reloaded = ExportedModel.from_pretrained(tmp_path)
    with torch.no_grad():
        eager_other = model(**other)
    report = compare_outputs(reloaded(**other), eager_other)
    assert report["max_abs_diff"] <= 1e-4, report["leaves"]["logits"]
    assert reloaded(**other).logits[0, -1].argmax() == eager_other.logits[0, -1].argmax()


def test_minilm_hidden_states_match_eager_with_the_tokenizers_whole_output():
    model, tokenizer = packaged("minilm")
    sentences = ["A man is eating food.", "Someone is having a meal, slowly."]
    encoded = tokenizer(sentences, padding=True, return_tensors="pt")
    exported = DynamoExporter().export(model, dict(encoded), config=DynamoConfig(dynamic=True))
    other = tokenizer(["A cat sits on the mat."], padding=True, return_tensors="pt")
    with torch.no_grad():
        eager = model(**other)
    out = exported(**other)  # the tokenizer's BatchEncoding, as a user would pass it
    assert type(out) is type(eager)
    report = compare_outputs(out, eager)
    assert report["max_abs_diff"] <= 1e-4, report["leaves"]
    assert set(report["leaves"]) >= {"last_hidden_state", "pooler_output"}
