"""The ExecuTorch custom-op path (``llama::update_cache`` + ``llama::custom_sdpa`` on a cache kept as state) and a
tied weight stored once (the weights in a ``.ptd`` beside the ``.pte``).

One export of a tiny Llama with tied embedding / lm_head, batch-1 unpadded sample, static cache, multi-token decode,
is shared by the module. Where the path is not valid, :func:`custom_ops_unsupported` says why (checked without
exporting); the left-padded batch-2 export keeps the SDPA path (tests/models/test_generate_executorch.py).
"""

from __future__ import annotations

import copy
import dataclasses
import types

import pytest
import torch

from hfexport import ExecutorchConfig, ExportedModel, UnsupportedError
from hfexport.testing.tiny import TINY_CASES

pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")

CACHE_LEN = 48
NEW_TOKENS = 24


def _tied_llama():
    model = TINY_CASES["llama"].build()
    model.config.tie_word_embeddings = True
    model.lm_head.weight = model.model.embed_tokens.weight
    return model


def _static(model):
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample, gen.cache_implementation, gen.max_cache_len = False, "static", CACHE_LEN
    return gen


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    from hfexport.exporter_executorch import ExecutorchExporter

    case = TINY_CASES["llama"]
    model = _tied_llama()
    gen = _static(model)
    sample = case.inputs(1, 6, padded=False)
    result = ExecutorchExporter().export_for_generation(model, sample, ExecutorchConfig(dynamic=True),
                                                        generation_config=gen, multi_token_decode=True)
    directory = tmp_path_factory.mktemp("tied")
    result.save_pretrained(directory)
    return case, model, gen, result, directory


def _program_ops(manager) -> set[str]:
    return {str(n.target) for n in manager.exported_program().graph.nodes if n.op == "call_function"}


def test_the_custom_op_path_is_taken_and_generates_eagers_tokens(exported):
    case, model, gen, result, _ = exported
    decode = result.components["decode"]
    assert decode.metadata.kwargs["past_key_values"]["state_layout"] == "bshd"
    ops = _program_ops(decode.program)
    assert any("llama.custom_sdpa" in op for op in ops) and any("llama.update_cache" in op for op in ops), ops
    assert not any("index_put" in op or "repeat" in op for op in ops), ops
    for seq in (9, 5):  # two prompts in a row: each starts a new sequence
        prompt = case.inputs(1, seq, padded=False)
        eager_gen = copy.deepcopy(gen)
        eager_gen.max_new_tokens = NEW_TOKENS
        with torch.no_grad():
            expected = model.generate(**prompt, generation_config=eager_gen)
        got = result.generate(**prompt, max_new_tokens=NEW_TOKENS)
        assert torch.equal(got, expected), (got, expected)


def test_each_layer_lowers_to_one_delegate_between_the_attention_kernels(exported):
    # rotate_half's slices, RMSNorm's mean, the heads' symbolic views (delegable.py) no longer cut a layer apart:
    # before, a layer was 5 delegates with slice_copy, mean and view ops between them
    _, model, _, result, _ = exported
    graph = result.components["decode"].program.exported_program().graph
    targets = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    layers = model.config.num_hidden_layers
    # one per layer (after its attention), the first layer's projections, the rotary angles, cos/sin, the lm_head
    assert targets.count("executorch_call_delegate") <= layers + 4, targets
    left = [t for t in targets if any(op in t for op in ("slice_copy", "mean", "view", "alias", "neg"))]
    assert not left, left


def test_the_state_reads_back_in_the_callers_layout_and_counters_follow(exported):
    case, model, _, result, _ = exported
    from transformers import StaticCache

    from hfexport.generation.loop import Component as _Component

    ids = case.inputs(1, 7, padded=False)["input_ids"]
    mask = torch.ones(1, 1, 7, CACHE_LEN, dtype=torch.bool).tril(diagonal=0)
    runner = result.runner("decode")
    cache = _Component(result, "decode").initial_cache(1)
    out = runner(input_ids=ids, past_key_values=cache, position_ids=torch.arange(7)[None], attention_mask=mask)
    eager_cache = StaticCache(config=model.config, max_cache_len=CACHE_LEN)
    with torch.no_grad():
        eager = model(input_ids=ids, past_key_values=eager_cache, position_ids=torch.arange(7)[None], use_cache=True)
    torch.testing.assert_close(out.logits, eager.logits, atol=1e-4, rtol=1e-4)
    state = runner.state()
    for i, layer in enumerate(eager_cache.layers):
        got = state[f"past_key_values.layers.{i}.keys"]
        assert got.shape == layer.keys.shape  # [batch, heads, seq, dim], as the caller's cache
        torch.testing.assert_close(got[..., :7, :], layer.keys[..., :7, :], atol=1e-4, rtol=1e-4)
        assert int(cache.layers[i].cumulative_length) == 7


def test_a_padding_mask_is_refused_not_ignored(exported):
    case, _, _, result, _ = exported
    from hfexport.generation.loop import Component as _Component

    runner = result.runner("decode")
    runner.reset()
    ids = case.inputs(1, 4, padded=False)["input_ids"]
    mask = torch.ones(1, 1, 4, CACHE_LEN, dtype=torch.bool).tril(diagonal=0)
    mask[..., 0] = False  # slot 0 is padding
    with pytest.raises(UnsupportedError, match="custom_sdpa"):
        runner(input_ids=ids, past_key_values=_Component(result, "decode").initial_cache(1),
               position_ids=torch.arange(4)[None], attention_mask=mask)


def test_the_tied_weight_is_stored_once(exported):
    _, model, _, _, directory = exported
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # the tied tensor counted once
    embedding = model.model.embed_tokens.weight
    files = {p.name: p.stat().st_size for p in directory.iterdir() if p.suffix in (".pte", ".ptd")}
    assert set(files) == {"decode.pte", "decode.ptd"}, files
    table = embedding.numel() * embedding.element_size()  # 64 KiB here, 18% of the weights
    # every weight once in the .ptd (a second copy of the table would add its 64 KiB; alignment padding is less)
    assert weights <= files["decode.ptd"] < weights + table / 4, (files, weights)
    assert files["decode.pte"] < table, "the .pte holds the table (it should hold the graph only)"
    manifest = (directory / "export.json").read_text()
    assert '"decode.ptd"' in manifest


def test_the_saved_pair_reloads_and_generates_eagers_tokens(exported):
    case, model, gen, _, directory = exported
    reloaded = ExportedModel.from_pretrained(directory)
    prompt = case.inputs(1, 8, padded=False)
    eager_gen = copy.deepcopy(gen)
    eager_gen.max_new_tokens = NEW_TOKENS
    with torch.no_grad():
        expected = model.generate(**prompt, generation_config=eager_gen)
    assert torch.equal(reloaded.generate(**prompt, max_new_tokens=NEW_TOKENS), expected)


@pytest.mark.parametrize("change,reason", [
    ("batch2", "batch 2"),
    ("padded", "pads"),
    ("eager_attention", "not 'sdpa'"),
    ("sliding", "sliding"),
    ("dynamic_cache", None),
    ("alloc_graph_input", None),
    ("quantizer", "quantizer"),
])
def test_where_the_kernels_cannot_express_it_the_export_keeps_the_sdpa_path(change, reason):
    from transformers import DynamicCache, StaticCache

    from hfexport.backends.executorch.custom_sdpa import custom_ops_unsupported
    from hfexport.backends.executorch.state import keeps_cache_state

    case = TINY_CASES["llama"]
    model = case.build()
    batch = 2 if change == "batch2" else 1
    inputs = case.inputs(batch, 6, padded=False)
    if change == "padded":
        inputs["attention_mask"][:, :2] = 0
    cache = StaticCache(config=model.config, max_cache_len=CACHE_LEN)
    cache.early_initialization(batch, model.config.num_key_value_heads,
                               model.config.hidden_size // model.config.num_attention_heads, torch.float32, "cpu")
    inputs["past_key_values"] = DynamicCache(config=model.config) if change == "dynamic_cache" else cache
    if change == "eager_attention":
        model.set_attn_implementation("eager")
    if change == "sliding":
        model.config.sliding_window = 4
        model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    config = ExecutorchConfig(dynamic=True, alloc_graph_input=change != "alloc_graph_input")
    if change == "quantizer":
        from hfexport.quantizers.pt2e import PT2EQuantizer

        stub = types.SimpleNamespace(annotate=lambda model: model, validate=lambda model: None)
        config = dataclasses.replace(config, quantizer=PT2EQuantizer(stub))  # only its presence is read
    if change in ("dynamic_cache", "alloc_graph_input"):  # the exporter asks only when the cache is kept as state
        assert not keeps_cache_state(config, inputs)
        return
    found = custom_ops_unsupported(model, inputs, config)
    assert found is not None and reason in found, found


def test_the_capture_attention_matches_eager_and_refuses_what_it_cannot_express():
    """The attention and cache update used while tracing, run eagerly (the kernels' ATen ops): the same logits as
    transformers' SDPA over a StaticCache; an attention whose keys are not the cache's raises CustomOpsUnsupported
    (the exporter then traces the SDPA path)."""
    from transformers import StaticCache
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from hfexport.backends.executorch.custom_sdpa import CustomOpsUnsupported, llama_custom_ops

    model = TINY_CASES["llama"].build()
    ids = TINY_CASES["llama"].inputs(1, 7, padded=False)["input_ids"]
    config = model.config
    head_dim = config.hidden_size // config.num_attention_heads

    def cache():
        made = StaticCache(config=config, max_cache_len=CACHE_LEN)
        made.early_initialization(1, config.num_key_value_heads, head_dim, torch.float32, "cpu")
        return made

    eager_cache = cache()
    with torch.no_grad():
        expected = [model(input_ids=ids, past_key_values=eager_cache).logits,
                    model(input_ids=ids[:, :1], past_key_values=eager_cache).logits]
        with llama_custom_ops({"past_key_values": cache()}) as traced:
            bshd = traced["past_key_values"]
            assert bshd.layers[0].keys.shape == (1, CACHE_LEN, config.num_key_value_heads, head_dim)
            got = [model(input_ids=ids, past_key_values=bshd).logits,
                   model(input_ids=ids[:, :1], past_key_values=bshd).logits]
            query = torch.zeros(1, config.num_attention_heads, 1, head_dim)
            stray = torch.zeros(1, 4, config.num_key_value_heads, head_dim)
            with pytest.raises(CustomOpsUnsupported, match="not the static cache"):
                ALL_ATTENTION_FUNCTIONS["sdpa"](model.model.layers[0].self_attn, query, stray, stray, None)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bshd.layers[0].keys.transpose(1, 2)[..., :8, :], eager_cache.layers[0].keys[..., :8, :],
                               atol=1e-6, rtol=1e-6)
    assert "sdpa" not in ALL_ATTENTION_FUNCTIONS._local_mapping, "the capture attention is removed after the block"
