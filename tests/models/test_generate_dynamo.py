"""ExportedModel.generate on Dynamo exports gives exactly the tokens of eager model.generate.

Every text family x {dynamic cache, static cache} x {single-token, multi-token decode}; a left-padded batch
of 2 whose prompt length differs from the capture's; 32 new tokens (Gemma3's window is 8, so it decodes
past it several times). The default suite runs each path once (``DEFAULT``: both caches on a decoder, a
sliding-window decoder, an encoder-decoder, an audio encoder-decoder, Mamba); the sweep
(make test-sweep) every combination, for time (each case is its own export; the matrix's generate rows run every
family).
"""

from __future__ import annotations

import copy

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, UnsupportedError
from generation_cases import assert_greedy_equals_eager, generation_config, text_inputs

from hfexport.testing.tiny import TINY_CASES

NEW_TOKENS = 32
FAMILIES = ["llama", "qwen3", "gpt2", "gemma3", "mixtral", "qwen3_moe", "t5", "whisper", "mamba"]
COMBOS = [("dynamic", False), ("dynamic", True), ("static", False), ("static", True)]
DEFAULT = {("llama", "dynamic", False), ("llama", "static", True), ("gemma3", "dynamic", False), ("t5", "dynamic", False),
           ("whisper", "static", True), ("mamba", "dynamic", False)}
CASES = [pytest.param(f, c, m, marks=[] if (f, c, m) in DEFAULT else [pytest.mark.sweep],
                      id=f"{f}-{c}-{'multi' if m else 'single'}") for f in FAMILIES for c, m in COMBOS]

# (family, cache, multi) -> why it cannot work, naming the upstream limitation
UNSUPPORTED = {
    ("mamba", "dynamic", True): "transformers MambaMixer.forward (modeling_mamba.py) runs the recurrent update only "
    "for seq_len == 1 and restarts the scan from a zero state for longer inputs, so a merged decode cannot continue",
    ("mamba", "static", True): "same as above: Mamba has no multi-token continuation in transformers",
}


_text_inputs = text_inputs
_generation_config = generation_config


@pytest.mark.parametrize("family,cache,multi", CASES)
def test_greedy_tokens_equal_eager(family, cache, multi):
    case = TINY_CASES[family]
    model = case.build()
    gen = _generation_config(model, cache)
    # a static cross-attention cache pins the encoder length: capture a longer input, and generate() right-pads
    # shorter ones to it (masked), which test_static_cross_cache_pads_shorter_prompts covers on its own
    static_cross = cache == "static" and model.config.is_encoder_decoder
    sample = _text_inputs(case, 2, 12 if static_cross else 6)
    reason = UNSUPPORTED.get((family, cache, multi))
    if reason:
        with pytest.raises(UnsupportedError, match="multi_token_decode"):
            DynamoExporter().export_for_generation(model, sample, DynamoConfig(dynamic=True), generation_config=gen,
                                                   multi_token_decode=multi)
        pytest.skip(reason)
    exported = DynamoExporter().export_for_generation(
        model, sample, DynamoConfig(dynamic=True), generation_config=gen, multi_token_decode=multi
    )
    expected_keys = {"prefill", "decode"} | ({"encoder"} if model.config.is_encoder_decoder else set())
    assert set(exported.components) == expected_keys
    assert_greedy_equals_eager(model, exported, case, gen, NEW_TOKENS)


def test_static_cross_cache_refuses_longer_prompts_clearly():
    case = TINY_CASES["t5"]
    model = case.build()
    exported = DynamoExporter().export_for_generation(
        model, _text_inputs(case, 2, 6), DynamoConfig(dynamic=True), generation_config=_generation_config(model, "static")
    )
    with pytest.raises(UnsupportedError, match="cross-attention cache holds 6"):
        exported.generate(**_text_inputs(case, 2, 9), max_new_tokens=4)


def test_static_cache_too_small_for_the_request_is_refused():
    case = TINY_CASES["llama"]
    model = case.build()
    gen = _generation_config(model, "static")
    gen.max_cache_len = 16
    exported = DynamoExporter().export_for_generation(model, _text_inputs(case, 2, 6), DynamoConfig(dynamic=True),
                                                      generation_config=gen)
    with pytest.raises(UnsupportedError, match="max_cache_len"):
        exported.generate(**_text_inputs(case, 2, 9), max_new_tokens=NEW_TOKENS)


def test_eos_stops_rows_and_pads_like_eager():
    case = TINY_CASES["llama"]
    model = case.build()
    exported = DynamoExporter().export_for_generation(model, _text_inputs(case, 2, 6), DynamoConfig(dynamic=True))
    prompt = _text_inputs(case, 2, 9)
    with torch.no_grad():
        free = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    eos = int(free[0, 9 + 3])  # a token row 0 emits early: treat it as EOS
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=12, do_sample=False, eos_token_id=eos, pad_token_id=0)
    got = exported.generate(**prompt, max_new_tokens=12, eos_token_id=eos, pad_token_id=0)
    assert torch.equal(got, expected)
    assert (got[0, 9 + 4 :] == 0).all() or got.shape[1] < 9 + 12
    # min_new_tokens holds EOS back for that many steps, as eager's MinNewTokensLengthLogitsProcessor does
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=12, min_new_tokens=8, do_sample=False, eos_token_id=eos,
                                  pad_token_id=0)
    got = exported.generate(**prompt, max_new_tokens=12, min_new_tokens=8, eos_token_id=eos, pad_token_id=0)
    assert got.shape[1] >= 9 + 8 and torch.equal(got, expected)


def test_sampling_is_reproducible_with_a_seed_and_respects_top_k():
    case = TINY_CASES["llama"]
    model = case.build()
    exported = DynamoExporter().export_for_generation(model, _text_inputs(case, 2, 6), DynamoConfig(dynamic=True))
    prompt = _text_inputs(case, 1, 5)
    torch.manual_seed(123)
    a = exported.generate(**prompt, max_new_tokens=10, do_sample=True, top_k=1)
    greedy = exported.generate(**prompt, max_new_tokens=10)
    assert torch.equal(a, greedy), "top_k=1 sampling must be greedy"
    torch.manual_seed(7)
    b = exported.generate(**prompt, max_new_tokens=10, do_sample=True, temperature=1.5)
    torch.manual_seed(7)
    c = exported.generate(**prompt, max_new_tokens=10, do_sample=True, temperature=1.5)
    assert torch.equal(b, c)


def test_per_component_configs_must_name_every_component():
    from hfexport import ConfigError

    case = TINY_CASES["llama"]
    model = case.build()
    with pytest.raises(ConfigError) as info:
        DynamoExporter().export_for_generation(model, _text_inputs(case, 2, 6), {"prefill": DynamoConfig(),
                                                                                 "encoder": DynamoConfig()})
    text = str(info.value)
    assert "'decode'" in text and "'encoder' is not a component" in text
    exported = DynamoExporter().export_for_generation(
        model, _text_inputs(case, 2, 6), {"prefill": DynamoConfig(dynamic=True), "decode": DynamoConfig()}
    )
    assert isinstance(exported.components["prefill"].metadata.inputs[0].shape[1], str)  # dynamic
    assert exported.components["decode"].metadata.inputs[0].shape == [2, 1]  # static


def test_a_failing_component_is_named_with_its_inputs(monkeypatch):
    from hfexport import ExportError

    case = TINY_CASES["llama"]
    model = case.build()
    real = DynamoExporter.export_program

    def fail_on_decode(self, submodel, inputs, config):
        if "past_key_values" in inputs and inputs["input_ids"].shape[-1] == 1:
            raise RuntimeError("boom in decode")
        return real(self, submodel, inputs, config)

    monkeypatch.setattr(DynamoExporter, "export_program", fail_on_decode)
    with pytest.raises(ExportError) as info:
        DynamoExporter().export_for_generation(model, _text_inputs(case, 2, 6), DynamoConfig(dynamic=True))
    assert info.value.component == "decode" and info.value.submodule == "LlamaForCausalLM"
    assert "past_key_values" in info.value.input_keys and "boom in decode" in str(info.value)


def test_capture_leaves_model_inputs_and_generation_config_unchanged():
    from hfexport.utils import decompose_prefill_decode

    case = TINY_CASES["gemma3"]
    model = case.build()
    gen = _generation_config(model, "static")
    gen_before = gen.to_dict()
    model_gen_before = model.generation_config.to_dict()
    inputs = _text_inputs(case, 2, 6)
    snapshot = {k: v.clone() for k, v in inputs.items()}
    attrs = set(vars(model))
    parts = decompose_prefill_decode(model, inputs, gen, multi_token_decode=True)
    assert gen.to_dict() == gen_before and model.generation_config.to_dict() == model_gen_before
    assert set(vars(model)) == attrs
    assert all(torch.equal(inputs[k], v) for k, v in snapshot.items())
    assert parts["decode"][1]["input_ids"].shape == (2, 2)  # two decode steps merged
    assert type(parts["decode"][1]["past_key_values"].layers[0]).__name__ == "StaticLayer"  # no sliding layer


class _Recorder:
    """A streamer that keeps every ``put`` (as lists) and counts ``end`` calls."""

    def __init__(self):
        self.puts, self.ends = [], 0

    def put(self, value):
        self.puts.append(value.tolist())

    def end(self):
        self.ends += 1


@pytest.mark.parametrize("family", ["t5", "whisper", "llama"])
def test_the_streamer_gets_what_model_generate_hands_it(family):
    """model.generate hands a streamer the (decoder) prompt first, then each token: transformers' TextStreamer
    with skip_prompt=True relies on it, for encoder-decoders too (their prompt is the decoder start token)."""
    case = TINY_CASES[family]
    model = case.build()
    sample = _text_inputs(case, 1, 6)
    exported = DynamoExporter().export_for_generation(model, sample, DynamoConfig(dynamic=True))
    eager, got = _Recorder(), _Recorder()
    with torch.no_grad():
        model.generate(**copy.deepcopy(sample), max_new_tokens=6, do_sample=False, streamer=eager)
    exported.generate(**copy.deepcopy(sample), max_new_tokens=6, streamer=got)
    assert eager.ends == 1 and len(eager.puts) > 2
    assert got.puts == eager.puts and got.ends == eager.ends


def test_a_separate_prefill_graph_returns_the_last_positions_logits_only():
    """generate() reads only the prompt's last logits (eager passes logits_to_keep=1): a prefill graph of its own
    traces logits_to_keep=1 as a constant, so it projects one position through the LM head, not the whole prompt; a
    multi-token decode keeps every query position (assisted decoding reads them)."""
    case = TINY_CASES["llama"]
    model = case.build()
    prompt = text_inputs(case, 2, 9)
    with torch.no_grad():
        full = model(**prompt).logits
    assert full.shape[1] == 9  # eager's forward without the option: every position
    exported = DynamoExporter().export_for_generation(model, text_inputs(case, 2, 6), DynamoConfig(dynamic=True),
                                                      generation_config=generation_config(model, "dynamic"))
    prefill = exported.components["prefill"].metadata
    assert prefill.in_constants.get("logits_to_keep") == 1
    logits = next(s for s in prefill.outputs if s.name == "logits")
    assert logits.shape[1:] == [1, model.config.vocab_size], logits.shape
    multi = DynamoExporter().export_for_generation(model, text_inputs(case, 2, 6), DynamoConfig(dynamic=True),
                                                   generation_config=generation_config(model, "static"),
                                                   multi_token_decode=True)
    decode = next(s for s in multi.components["decode"].metadata.outputs if s.name == "logits")
    assert isinstance(decode.shape[1], str), decode.shape  # the query axis, symbolic
    assert_greedy_equals_eager(model, exported, case, generation_config(model, "dynamic"), 8)


@pytest.mark.parametrize("cache", ["dynamic", pytest.param("static", marks=pytest.mark.sweep)])  # (for time)
def test_a_linear_attention_and_sliding_window_hybrid_keeps_its_conv_state(cache):
    # Inkling's "hybrid_sliding" layers hold a linear-attention state beside a sliding-window KV cache; making the
    # window full for the export must keep that state (it became a bare KV layer: "Cannot get conv state"); with a
    # static cache the linear-attention mask is the step's 2D padding mask, not a mask over cache slots
    from transformers import cache_utils

    from hfexport.capture.decompose import full_attention_cache
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    model = build_model("inkling_text", "InklingForCausalLM")
    assert set(model.config.layer_types) == {"hybrid_sliding"}
    full = full_attention_cache(cache_utils.DynamicCache(config=model.config))
    assert all(type(layer) is cache_utils.LinearAttentionAndFullAttentionLayer for layer in full.layers)
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample, gen.cache_implementation, gen.max_cache_len = False, cache, (48 if cache == "static" else None)
    sample = sample_inputs(model, "inkling_text", batch=2, seq=6, for_generation=True)
    exported = DynamoExporter().export_for_generation(model, sample, DynamoConfig(dynamic=True), generation_config=gen)
    prompt = sample_inputs(model, "inkling_text", batch=2, seq=9, for_generation=True)
    eager_gen = copy.deepcopy(gen)
    eager_gen.max_new_tokens = eager_gen.min_new_tokens = 12
    with torch.no_grad():
        expected = model.generate(**prompt, generation_config=eager_gen)
    got = exported.generate(**prompt, max_new_tokens=12, min_new_tokens=12)
    assert torch.equal(got, expected), (got, expected)


def _longcat():
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    return build_model("longcat_flash", "LongcatFlashForCausalLM")


def test_longcat_flashs_experts_without_their_loop_compute_the_same():
    # LongcatFlashExperts loops over nonzero() of its routing mask (.item() per expert): the decode graph failed
    # with GuardOnDataDependentSymNode; the workaround computes every (token, choice) at once
    from hfexport.workarounds.models.longcat_flash import _batched_experts

    model = _longcat()
    experts = next(m for m in model.modules() if type(m).__name__ == "LongcatFlashExperts")
    hidden = torch.randn(5, model.config.hidden_size)
    index = torch.randint(0, experts.total_experts, (5, 3))
    index[:, 0] = torch.arange(5) % experts.num_routed_experts  # routed experts and identity ones, both chosen
    assert bool((index >= experts.num_routed_experts).any())
    weights = torch.rand(5, 3)
    with torch.no_grad():
        torch.testing.assert_close(_batched_experts(experts, hidden, index, weights), experts(hidden, index, weights),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.sweep
def test_longcat_flash_generates_like_eager():
    from hfexport.tools.matrix.inputs import sample_inputs

    model = _longcat()
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample = False
    sample = sample_inputs(model, "longcat_flash", batch=2, seq=6, for_generation=True)
    exported = DynamoExporter().export_for_generation(model, sample, DynamoConfig(dynamic=True), generation_config=gen)
    assert "longcat-flash-batched-experts" in exported.components["decode"].metadata.workarounds
    prompt = sample_inputs(model, "longcat_flash", batch=2, seq=9, for_generation=True)
    with torch.no_grad():
        expected = model.generate(**copy.deepcopy(prompt), generation_config=gen, max_new_tokens=12, min_new_tokens=12)
    got = exported.generate(**prompt, max_new_tokens=12, min_new_tokens=12)
    assert torch.equal(got, expected), (got, expected)


def test_an_encoder_decoder_with_sliding_window_layers_generates_past_the_captured_cache_length():
    """T5Gemma's decoder alternates sliding and full layers: generate() builds sliding cache layers whose length is
    a Python int, which the trace baked into the decode graph ('self_attention_cache.layers.0.keys ... dim 2 is
    static at 2'). The capture now hands generate a cache whose layers are all full, as for decoder-only models."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    model = build_model("t5gemma", "T5GemmaForConditionalGeneration")
    assert "sliding_attention" in model.config.get_text_config(decoder=True).layer_types
    exported = DynamoExporter().export_for_generation(model, sample_inputs(model, "t5gemma", seq=6, for_generation=True),
                                                      DynamoConfig(dynamic=True))
    decode = exported.components["decode"].metadata
    sliding = next(s for s in decode.inputs if s.name == "past_key_values.self_attention_cache.layers.0.keys")
    assert isinstance(sliding.shape[2], str), sliding.shape  # the cache length stays symbolic
    inputs = sample_inputs(model, "t5gemma", seq=9, for_generation=True)
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    assert torch.equal(exported.generate(**inputs, max_new_tokens=12), want)


def test_cpmant_exports_for_any_prompt_length():
    # CpmAntModel._prepare_attention_mask builds a Python list as long as the sequence: the export was pinned to the
    # traced length ("dim 1 is static at 6"); the workaround builds the same mask with torch.arange
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model
    from hfexport.workarounds.models.cpmant import _prepare_attention_mask

    torch.manual_seed(0)
    model = build_model("cpmant", "CpmAntForCausalLM").eval()
    inner = model.cpmant
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 9], [3, 4, 5, 6, 7, 8, 9]], dtype=torch.int32)
    length = (ids != 0).sum(-1).to(torch.int32)
    full = torch.cat((torch.zeros(2, inner.prompt_length, dtype=torch.int32), ids), dim=1)
    span, context = torch.zeros_like(full), torch.ones_like(full)
    assert torch.equal(_prepare_attention_mask(inner, full, span, context, length),
                       inner._prepare_attention_mask(full, span, context, length))
    exported = DynamoExporter().export(model, sample_inputs(model, "cpmant", batch=2, seq=6), DynamoConfig(dynamic=True))
    inputs = sample_inputs(model, "cpmant", batch=2, seq=9)
    with torch.no_grad():
        want = model(**inputs).logits
    got = exported(**inputs).logits
    assert got.shape == want.shape and float((got - want).abs().max()) <= 1e-4
    assert "cpmant-dynamic-mask-length" in exported.components["model"].metadata.workarounds


def test_cpmant_generates_with_its_cache_and_its_whole_sequence_each_step():
    """CPM-Ant keeps a cache but its forward takes every token again and slices the cached prefix off itself (its
    prepare_inputs_for_generation passes the whole sequence): the decode graph was fed the new token alone and
    refused it ("Guard failed: past_key_values[...].size()[2] <= 32 + input_ids.size()[1]")."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    model = build_model("cpmant", "CpmAntForCausalLM").eval()
    exported = DynamoExporter().export_for_generation(
        model, sample_inputs(model, "cpmant", seq=6, for_generation=True), DynamoConfig(dynamic=True))
    decode = exported.components["decode"].metadata
    assert decode.input_spec("input_ids").example_shape == decode.input_spec("attention_mask").example_shape
    inputs = sample_inputs(model, "cpmant", seq=9, for_generation=True)
    assert int((inputs["attention_mask"] == 0).sum()) > 0  # a left-padded batch
    with torch.no_grad():
        want = model.generate(**copy.deepcopy(inputs), max_new_tokens=8, do_sample=False)
    assert torch.equal(exported.generate(**inputs, max_new_tokens=8), want)


def test_prophetnet_decodes_past_the_cache_length_it_was_traced_with():
    """ProphetNet's decode position was int(padding_idx + lengths): the decode graph took one cache length only
    ("Guard failed: 1 + past_key_values[...].size()[2] == 3"), so generate() stopped at its second new token; the
    workaround fills the same position into a tensor (checked against upstream's below)."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model
    from hfexport.workarounds.models.prophetnet import _position_embeddings

    torch.manual_seed(0)
    model = build_model("prophetnet", "ProphetNetForConditionalGeneration").eval()
    table = model.prophetnet.decoder.position_embeddings
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.zeros(2, 1, 5, 8), torch.zeros(2, 1, 5, 8), 0)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    for kwargs in ({"past_key_values": cache}, {"attention_mask": mask}):
        shape = (2, 1) if kwargs.get("past_key_values") is not None else (2, 3)
        ours, upstream = _position_embeddings(table, shape, "cpu", **kwargs), table(shape, "cpu", **kwargs)
        assert all(torch.equal(a, b) for a, b in zip(ours, upstream, strict=True))
    exported = DynamoExporter().export_for_generation(
        model, sample_inputs(model, "prophetnet", seq=6, for_generation=True), DynamoConfig(dynamic=True))
    assert "prophetnet-dynamic-decode-position" in exported.components["decode"].metadata.workarounds
    inputs = sample_inputs(model, "prophetnet", seq=9, for_generation=True)
    with torch.no_grad():
        want = model.generate(**copy.deepcopy(inputs), max_new_tokens=8, do_sample=False)
    assert torch.equal(exported.generate(**inputs, max_new_tokens=8), want)


def test_an_encoder_decoder_gets_the_inputs_its_decoder_was_traced_with_at_every_step():
    """UDOP's prepare_inputs_for_generation passes the layout boxes (bbox) to every decoder call, so its decoder
    graphs take them: generate() passed the encoder's mask only ("missing inputs ['bbox']")."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    model = build_model("udop", "UdopForConditionalGeneration")
    exported = DynamoExporter().export_for_generation(model, sample_inputs(model, "udop", seq=6, for_generation=True),
                                                      DynamoConfig(dynamic=True))
    assert exported.components["decode"].metadata.kwargs["bbox"].fed
    inputs = sample_inputs(model, "udop", seq=9, for_generation=True)
    with torch.no_grad():
        want = model.generate(**copy.deepcopy(inputs), max_new_tokens=8, do_sample=False)
    assert torch.equal(exported.generate(**inputs, max_new_tokens=8), want)
