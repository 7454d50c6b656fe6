"""Tests for the seeded tiny test models in ``hfexport.testing.tiny``."""

from __future__ import annotations

import functools

import pytest
import torch
import transformers

from hfexport.testing.tiny import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    TINY_CASES,
    VOCAB,
    TinyCase,
    t5_decoder_len,
    tiny_inputs,
    tiny_model,
)
from hfexport.testing.tiny_multimodal import (
    GEMMA3_VL_IMAGE_TOKENS,
    IMAGE_ID,
    LLAVA_IMAGE_TOKENS,
    PALIGEMMA_IMAGE_TOKENS,
    QWEN2_VL_IMAGE_TOKENS,
    TEXT_ID_END,
    WHISPER_FRAMES,
    WHISPER_MEL_BINS,
)

REQUIRED = {
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "gemma3": "Gemma3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "bert": "BertModel",
    "t5": "T5ForConditionalGeneration",
    "vit": "ViTForImageClassification",
    "whisper": "WhisperForConditionalGeneration",
    "mamba": "MambaForCausalLM",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "llava": "LlavaForConditionalGeneration",
    "paligemma": "PaliGemmaForConditionalGeneration",
    "gemma3_vl": "Gemma3ForConditionalGeneration",
}
FAMILIES = {
    "decoder-only",
    "encoder-only",
    "encoder-decoder",
    "ssm",
    "sliding-window",
    "moe",
    "vision",
    "audio",
    "image-text-to-text",
}
CAUSAL_FAMILIES = {"decoder-only", "sliding-window", "moe", "ssm"}
NAMES = sorted(TINY_CASES)
GENERATIVE = [name for name in NAMES if TINY_CASES[name].generative]
SHAPES = [(2, 7), (1, 5)]


@functools.cache
def _model(name: str) -> transformers.PreTrainedModel:
    """Build each case once per test session (builds are deterministic)."""
    return tiny_model(name)


def _expected_output(case: TinyCase, batch: int, seq: int) -> tuple[str, tuple]:
    """Return the output attribute to check and its expected shape."""
    if case.family == "encoder-only":
        return "last_hidden_state", (batch, seq, 64)
    if case.family == "vision":
        return "logits", (batch, 4)
    if case.family == "encoder-decoder":
        return "logits", (batch, t5_decoder_len(seq), VOCAB)
    if case.family == "audio":
        return "logits", (batch, seq, VOCAB)
    if case.name == "qwen2_vl":
        return "logits", (batch, seq + QWEN2_VL_IMAGE_TOKENS + 2, VOCAB)
    if case.name == "llava":
        return "logits", (batch, seq + LLAVA_IMAGE_TOKENS, VOCAB)
    if case.name == "paligemma":
        return "logits", (batch, seq + PALIGEMMA_IMAGE_TOKENS, VOCAB)
    if case.name == "gemma3_vl":
        return "logits", (batch, seq + GEMMA3_VL_IMAGE_TOKENS + 2, VOCAB)
    return "logits", (batch, seq, VOCAB)


def _generate_kwargs(inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop teacher-forced decoder ids: generation starts from the decoder start token."""
    return {k: v for k, v in inputs.items() if k != "decoder_input_ids"}


def test_registry_has_required_cases_with_valid_metadata():
    assert set(REQUIRED) <= set(TINY_CASES)
    for name, case in TINY_CASES.items():
        assert case.name == name
        assert case.family in FAMILIES
        assert hasattr(transformers, case.auto_class), case.auto_class
    assert TINY_CASES["gemma3"].family == "sliding-window"
    assert {TINY_CASES[n].family for n in ("mixtral", "qwen3_moe")} == {"moe"}
    assert TINY_CASES["mamba"].family == "ssm"
    assert not TINY_CASES["bert"].generative and not TINY_CASES["vit"].generative


def test_unknown_name_raises_key_error_listing_cases():
    with pytest.raises(KeyError, match="llama"):
        tiny_model("no-such-model")
    with pytest.raises(KeyError):
        tiny_inputs("no-such-model")


@pytest.mark.parametrize("name", NAMES)
def test_build_is_deterministic_small_and_configured(name):
    case = TINY_CASES[name]
    rng_before = torch.get_rng_state()
    first, second = case.build(), case.build()
    assert torch.equal(rng_before, torch.get_rng_state()), "build must not disturb the global RNG"
    assert first is not second
    assert type(first).__name__ == REQUIRED.get(name, type(first).__name__)

    sd1, sd2 = first.state_dict(), second.state_dict()
    assert sd1.keys() == sd2.keys()
    for key in sd1:
        assert torch.equal(sd1[key], sd2[key]), f"{name}: {key} differs between builds"

    n_params = sum(p.numel() for p in first.parameters())
    assert 10_000 < n_params < 2_000_000, n_params
    assert not first.training
    assert {p.dtype for p in first.parameters()} == {torch.float32}
    if getattr(type(first), "_supports_sdpa", False):
        assert first.config._attn_implementation == "sdpa"

    auto_cls = getattr(transformers, case.auto_class)
    assert auto_cls._model_mapping[type(first.config)] is type(first)


@pytest.mark.parametrize("name", GENERATIVE)
def test_special_tokens_are_valid_and_distinct(name):
    model = _model(name)
    gen = model.generation_config
    assert gen.do_sample is False
    assert (gen.pad_token_id, gen.bos_token_id, gen.eos_token_id) == (PAD_ID, BOS_ID, EOS_ID)
    assert len({PAD_ID, BOS_ID, EOS_ID}) == 3
    vocab = model.get_output_embeddings().weight.shape[0]
    assert vocab == VOCAB
    assert max(PAD_ID, BOS_ID, EOS_ID) < vocab
    if model.config.is_encoder_decoder:
        assert 0 <= gen.decoder_start_token_id < vocab


@pytest.mark.parametrize("name", NAMES)
def test_inputs_are_seeded_and_padded(name):
    case = TINY_CASES[name]
    a, b = case.inputs(2, 7), case.inputs(2, 7)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    other = case.inputs(3, 7)
    assert any(not torch.equal(a[k][1], other[k][1]) for k in a), "inputs must be seeded by (batch, seq)"

    if "attention_mask" not in a:
        return
    ids, mask = a["input_ids"], a["attention_mask"]
    assert ids.shape == mask.shape and ids.dtype == torch.long
    assert int(ids.min()) >= 0 and int(ids.max()) < VOCAB
    assert mask[0, :2].tolist() == [0, 0] and bool(mask[0, 2:].all()) and bool(mask[1:].all())
    assert bool((ids[0, :2] == PAD_ID).all())
    assert int(ids[mask.bool()].min()) > max(PAD_ID, BOS_ID, EOS_ID), "pad/bos/eos ids in sampled text"
    unpadded = case.inputs(2, 7, padded=False)
    assert bool(unpadded["attention_mask"].all())
    assert bool(case.inputs(1, 5)["attention_mask"].all()), "batch 1 is never padded"


def test_image_text_inputs_match_model_expectations():
    qwen = tiny_inputs("qwen2_vl", 2, 7)
    assert (qwen["input_ids"] == IMAGE_ID).sum(dim=1).tolist() == [QWEN2_VL_IMAGE_TOKENS] * 2
    assert torch.equal(qwen["mm_token_type_ids"], (qwen["input_ids"] == IMAGE_ID).long())
    assert qwen["image_grid_thw"].tolist() == [[1, 4, 4]] * 2
    assert qwen["pixel_values"].shape == (2 * 16, 3 * 2 * 4 * 4)
    llava = tiny_inputs("llava", 2, 7)
    assert (llava["input_ids"] == IMAGE_ID).sum(dim=1).tolist() == [LLAVA_IMAGE_TOKENS] * 2
    assert llava["pixel_values"].shape == (2, 3, 16, 16)
    whisper = tiny_inputs("whisper", 2, 7)
    assert whisper["input_features"].shape == (2, WHISPER_MEL_BINS, WHISPER_FRAMES)
    assert int(whisper["decoder_input_ids"].max()) < TEXT_ID_END
    bert = tiny_inputs("bert", 2, 7)
    assert set(bert) == {"input_ids", "attention_mask", "token_type_ids"}
    t5 = tiny_inputs("t5", 2, 7)
    assert set(t5) == {"input_ids", "attention_mask", "decoder_input_ids"}
    assert t5["decoder_input_ids"][:, 0].tolist() == [PAD_ID, PAD_ID]


@pytest.mark.parametrize("batch,seq", SHAPES)
@pytest.mark.parametrize("name", NAMES)
def test_forward_is_finite_with_expected_shape(name, batch, seq):
    case = TINY_CASES[name]
    inputs = case.inputs(batch, seq)
    with torch.no_grad():
        out = _model(name)(**inputs)
    attr, shape = _expected_output(case, batch, seq)
    tensor = getattr(out, attr)
    assert tuple(tensor.shape) == shape
    assert tensor.dtype == torch.float32
    assert bool(torch.isfinite(tensor).all())
    if name == "bert":
        assert tuple(out.pooler_output.shape) == (batch, 64)


@pytest.mark.parametrize("name", [n for n in NAMES if TINY_CASES[n].family in CAUSAL_FAMILIES - {"ssm"}])
def test_left_padding_is_masked_out(name):
    """Row 0's last logits must not depend on its two left-pad positions.

    Position ids are derived from the mask as ``generate`` does; GPT-2's absolute
    positions need them (RoPE models are shift-invariant either way).
    """
    model, padded = _model(name), tiny_inputs(name, 2, 7)
    position_ids = (padded["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    real = padded["input_ids"][:1, 2:]
    with torch.no_grad():
        batched = model(**padded, position_ids=position_ids).logits[0, -1]
        alone = model(input_ids=real, attention_mask=torch.ones_like(real)).logits[0, -1]
    torch.testing.assert_close(batched, alone, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", GENERATIVE)
def test_generate_returns_four_new_tokens(name):
    model, inputs = _model(name), tiny_inputs(name, 1, 5)
    out = model.generate(**_generate_kwargs(inputs), max_new_tokens=4, do_sample=False)
    if name == "whisper":
        new = out  # Whisper's generate strips the decoder start token from its tensor output.
    elif model.config.is_encoder_decoder:
        assert out[:, 0].tolist() == [model.generation_config.decoder_start_token_id]
        new = out[:, 1:]
    else:
        prompt = inputs["input_ids"]
        assert torch.equal(out[:, : prompt.shape[1]], prompt)
        new = out[:, prompt.shape[1] :]
    assert tuple(new.shape) == (1, 4)
    assert int(new.min()) >= 0 and int(new.max()) < VOCAB
    again = model.generate(**_generate_kwargs(inputs), max_new_tokens=4, do_sample=False)
    assert torch.equal(out, again)


def test_gemma3_sliding_window_generation_past_twice_the_window_matches_recompute():
    model = _model("gemma3")
    window = model.config.sliding_window
    assert window == 8
    assert set(model.config.layer_types) == {"sliding_attention", "full_attention"}
    inputs = tiny_inputs("gemma3", 1, 5)
    n_new = 2 * window + 4
    out = model.generate(**inputs, max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False)
    assert out.shape == (1, 5 + n_new)
    ids = inputs["input_ids"]
    with torch.no_grad():
        for _ in range(n_new):
            next_id = model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, next_id], dim=1)
    assert torch.equal(out, ids), "cached sliding-window generation diverged from full recompute"
