"""ExportedModel.generate on OpenVINO Runtime (CPU, fp32) gives exactly the tokens of eager model.generate.

Every generative kind, stateful (the cache in OpenVINO variables, the default) and stateless (the cache as inputs and
outputs, for targets such as the NPU): decoder-only (Llama, Qwen3, GPT-2), sliding window (Gemma3), MoE (Mixtral),
encoder-decoder (T5), audio encoder-decoder (Whisper), SSM (Mamba) and image-text-to-text (Qwen2-VL, LLaVA,
PaliGemma, Gemma3); a left-padded batch of 2 whose prompt length differs from the capture's; 32 new tokens. A static
cache with multi-token decode is one IR serving the prompt and every step. Also: a second generate() starts from a
reset state (no leak between sequences), and beam search with 2 beams reorders the state through ``beam_idx`` as
eager does.

The default suite runs one family of each kind; the whole matrix is ``@pytest.mark.sweep``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from generation_cases import generation_config, text_inputs
from hfexport import OpenVINOConfig, UnsupportedError
from hfexport.exporter_openvino import OpenVINOExporter
from hfexport.testing.tiny import TINY_CASES

NEW_TOKENS = 32
FAMILIES = ["llama", "qwen3", "gpt2", "gemma3", "mixtral", "t5", "whisper", "mamba"]
UNSUPPORTED = {
    ("mamba", True): "transformers MambaMixer.forward (modeling_mamba.py) runs the recurrent update only for "
    "seq_len == 1 and restarts the scan from a zero state for longer inputs, so a merged decode cannot continue",
}
# (family, cache, multi_token_decode, stateful)
# Llama with a static cache and multi-token decode, stateful and stateless, is the `llama` fixture's export below
# (Whisper's stateless static cache in the sweep, for the suite's time: test_generate_whisper runs it stateful)
DEFAULT = [("gemma3", "static", True, True), ("mamba", "dynamic", False, True)]
SWEEP = [(f, c, m, s) for f in FAMILIES for c, m in (("static", True), ("dynamic", False)) for s in (True, False)
         if (f, c, m, s) not in DEFAULT and (f, m) not in UNSUPPORTED]
CASES = [pytest.param(*c, id="-".join(map(str, c))) for c in DEFAULT] + [
    pytest.param(*c, id="-".join(map(str, c)), marks=pytest.mark.sweep) for c in SWEEP]


def _export(model, case, cache, multi, stateful):
    static_cross = cache == "static" and model.config.is_encoder_decoder
    sample = text_inputs(case, 2, 12 if static_cross else 6)
    return OpenVINOExporter().export_for_generation(
        model, sample, OpenVINOConfig(dynamic=True, stateful=stateful), generation_config=generation_config(model, cache),
        multi_token_decode=multi,
    )


def _eager(model, gen, prompt, **overrides):
    eager_gen = copy.deepcopy(gen)
    eager_gen.max_new_tokens = NEW_TOKENS
    for key, value in overrides.items():
        setattr(eager_gen, key, value)
    with torch.no_grad():
        return model.generate(**prompt, generation_config=eager_gen)


@pytest.mark.parametrize("family,cache,multi,stateful", CASES)
def test_greedy_tokens_equal_eager(family, cache, multi, stateful):
    case = TINY_CASES[family]
    model = case.build()
    exported = _export(model, case, cache, multi, stateful)
    decode = exported.runner("decode")
    assert decode.stateful == stateful
    if stateful:  # the cache lives in variables: the decode graph takes none of it, plus beam_idx
        names = {n for port in decode.compiled.inputs for n in port.get_names()}
        assert "beam_idx" in names and not any(".layers." in n for n in names), names
    prompt = text_inputs(case, 2, 9)
    expected = _eager(model, generation_config(model, cache), prompt)
    got = exported.generate(**prompt, max_new_tokens=NEW_TOKENS)
    assert got.shape == expected.shape and torch.equal(got, expected), (got, expected)
    served = exported.components["prefill"] is exported.components["decode"]
    assert served == (multi and not model.config.is_encoder_decoder and (cache == "static" or stateful))


@pytest.fixture(scope="module", params=[True, False], ids=["stateful", "stateless"])
def llama(request):
    case = TINY_CASES["llama"]
    model = case.build()
    return case, model, _export(model, case, "static", True, request.param)


def test_second_generate_starts_from_a_reset_state(llama):
    case, model, exported = llama
    assert exported.components["prefill"] is exported.components["decode"]  # one IR serves the prompt too
    gen = generation_config(model, "static")
    first, second = text_inputs(case, 2, 9), text_inputs(case, 1, 5)
    second["input_ids"] = (second["input_ids"] + 7) % model.config.vocab_size
    for prompt in (first, second, first):
        expected = _eager(model, gen, prompt)
        got = exported.generate(**prompt, max_new_tokens=NEW_TOKENS)
        assert torch.equal(got, expected), (got, expected)


def test_beam_search_with_two_beams_equals_eager(llama):
    case, model, exported = llama
    gen = generation_config(model, "static")
    for prompt in (text_inputs(case, 1, 7), text_inputs(case, 2, 9)):
        expected = _eager(model, gen, prompt, num_beams=2)
        got = exported.generate(**prompt, max_new_tokens=NEW_TOKENS, num_beams=2)
        assert got.shape == expected.shape and torch.equal(got, expected), (got, expected)


def test_growing_cache_in_variables_is_one_ir_with_the_plugins_stateful_attention():
    """A stateful multi-token decode over a growing (dynamic) cache serves the prompt too, its variables starting
    empty at each sequence: one IR, as optimum-intel writes it. The CPU plugin then fuses each layer's
    ReadValue -> Concat -> SDPA -> Assign into ScaledDotProductAttentionWithKVCache (the static cache's scatter,
    transposes and GQA broadcasts do not fuse: ~40 % of a SmolLM2 decode step). Tokens equal eager for a left-padded
    batch of 2, batch 1, a second sequence after them, and 2 beams."""
    case = TINY_CASES["llama"]
    model = case.build()
    exported = _export(model, case, "dynamic", True, True)
    assert exported.components["prefill"] is exported.components["decode"]
    decode = exported.runner("decode")
    ops = decode.compiled.get_runtime_model().get_ordered_ops()
    kind = {op.get_friendly_name(): op.get_rt_info()["layerType"].astype(str) for op in ops}
    attention = [[kind[v.get_node().get_friendly_name()] for v in op.input_values()] for op in ops
                 if kind[op.get_friendly_name()] == "ScaledDotProductAttention"]
    # fused: each attention node reads its layer's state (MemoryInput) itself and takes q and k from RoPE nodes
    assert len(attention) == model.config.num_hidden_layers
    assert all(inputs[:2] == ["RoPE", "RoPE"] and inputs.count("MemoryInput") == 2 for inputs in attention), attention
    gen = generation_config(model, "dynamic")
    second = text_inputs(case, 1, 5)
    second["input_ids"] = (second["input_ids"] + 7) % model.config.vocab_size
    for prompt in (text_inputs(case, 2, 9), second):
        expected = _eager(model, gen, prompt)
        got = exported.generate(**prompt, max_new_tokens=NEW_TOKENS)
        assert got.shape == expected.shape and torch.equal(got, expected), (got, expected)
    prompt = text_inputs(case, 2, 9)
    expected = _eager(model, gen, prompt, num_beams=2)
    got = exported.generate(**prompt, max_new_tokens=NEW_TOKENS, num_beams=2)
    assert got.shape == expected.shape and torch.equal(got, expected), (got, expected)


def test_mamba_multi_token_decode_is_refused_with_the_reason():
    case = TINY_CASES["mamba"]
    with pytest.raises(UnsupportedError, match="multi_token_decode"):
        _export(case.build(), case, "dynamic", True, True)


# every image-text-to-text case, stateful and stateless: minutes on two cores, so all in the sweep (the vision towers'
# conversion is checked in the default suite by test_openvino_multimodal.py)
IMAGE_TEXT = ["qwen2_vl", "llava", "paligemma", "gemma3_vl"]


@pytest.mark.sweep
@pytest.mark.parametrize("stateful", [True, False], ids=["stateful", "stateless"])
@pytest.mark.parametrize("name", IMAGE_TEXT)
def test_image_text_to_text_generates_like_eager(name, stateful):
    case = TINY_CASES[name]
    model = case.build()
    exported = OpenVINOExporter().export_for_generation(model, case.inputs(2, 6),
                                                        OpenVINOConfig(dynamic=True, stateful=stateful))
    assert exported.runner("decode").stateful == stateful
    for batch, seq in ((2, 9), (1, 7)):
        inputs = case.inputs(batch, seq)
        with torch.no_grad():
            expected = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
        got = exported.generate(**inputs, max_new_tokens=NEW_TOKENS)
        assert got.shape == expected.shape and torch.equal(got, expected), (got, expected)


@pytest.mark.sweep  # ~40 s (NNCF AWQ + scale estimation); same_recipe itself is tested in tests/test_quantizers.py
def test_a_calibrated_quantizer_keeps_the_growing_cache_export_one_ir():
    """calibrate_components gives the prefill and the decode each a copy of the quantizer calibrated on its own calls;
    the decode graph still serves the prompt (same recipe), so a calibrated int4 export is one IR, not two."""
    from hfexport.quantizers.presets import recipe

    case = TINY_CASES["llama"]
    model = case.build()
    calibration = [text_inputs(case, 2, 7), text_inputs(case, 2, 5)]  # padded, as the traced sample: a mask input
    config = OpenVINOConfig(dynamic=True, stateful=True, quantizer=recipe("nncf-int4", "openvino", calibration))
    exported = OpenVINOExporter().export_for_generation(
        model, text_inputs(case, 2, 6), config, generation_config=generation_config(model, "dynamic"),
        multi_token_decode=True,
    )
    assert exported.components["prefill"] is exported.components["decode"]
    constants = {op.get_output_element_type(0).get_type_name() for op in
                 exported.components["decode"].program.get_ordered_ops() if op.get_type_name() == "Constant"}
    assert constants & {"u4", "i4"}, constants  # the int4 weights, AWQ-calibrated
