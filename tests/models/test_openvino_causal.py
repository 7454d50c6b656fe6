"""On the CPU, attention over a mask the graph proves purely causal runs with the plugin's ``causal`` flag
(``hfexport.backends.openvino.causal``), and gives eager's tokens.

The proof accepts the mask of an export traced on an unpadded prompt over a growing cache, and refuses a padded
export's (its ``attention_mask`` input), Gemma-3's sliding layers (a second comparison and an ``And``) and a static
cache's slot mask (it reads ``cache_position``'s values). The rewritten graphs give eager's greedy tokens: a stateful
growing cache (one IR; the prompt is its first call) and Gemma-3 past its sliding window. A stateless dynamic cache's
attention is proven too, but the plugin does not fuse it with a state, and its plain attention aligns ``causal``
top-left: the runner keeps its mask, and prompt lookup (multi-token calls after a non-empty cache) gives eager's
tokens.
"""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from hfexport import OpenVINOConfig
from hfexport.backends.openvino.causal import fused_with_state, proven_causal, use_plugin_causal
from hfexport.exporter_openvino import OpenVINOExporter
from hfexport.generation.loop import Component
from hfexport.testing.tiny import TINY_CASES

NEW_TOKENS = 32
PROMPT = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7, 11, 12, 13, 5, 6, 7]])


_EXPORTS: dict = {}


def _export(model, batch=1, stateful=True, multi=True, cache=None):
    """The export of ``model`` for generation with these settings, made once per module (the tests read the
    programs and run the exports; none changes them)."""
    key = (id(model), batch, stateful, multi, None if cache is None else cache.to_json_string())
    if key not in _EXPORTS:
        _EXPORTS[key] = (model, _new_export(model, batch, stateful, multi, cache))  # (model kept: its id stays its)
    return _EXPORTS[key][1]


def _new_export(model, batch, stateful, multi, cache):
    ids = torch.randint(3, model.config.vocab_size, (batch, 6))
    mask = torch.ones_like(ids)
    if batch > 1:
        mask[1, :2] = 0  # left padding: the trace keeps the attention_mask input
    return OpenVINOExporter().export_for_generation(
        model, {"input_ids": ids, "attention_mask": mask}, OpenVINOConfig(dynamic=True, stateful=stateful),
        generation_config=cache, multi_token_decode=multi,
    )


def _causal_nodes(program):
    return sum(n.get_type_name() == "ScaledDotProductAttention" and n.get_attributes().get("causal", False)
               for n in program.get_ordered_ops())


def _eager(model, **kwargs):
    with torch.no_grad():
        return model.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=NEW_TOKENS,
                              do_sample=False, **kwargs)


@pytest.fixture(scope="module")
def llama():
    return TINY_CASES["llama"].build()


@pytest.fixture(scope="module")
def gemma3():
    return TINY_CASES["gemma3"].build()


def test_the_proof_takes_a_pure_causal_mask_and_refuses_padding(llama):
    layers = llama.config.num_hidden_layers
    growing = _export(llama).components["decode"].program
    assert [len(nodes) for nodes in proven_causal(growing).values()] == [layers]
    assert proven_causal(_export(llama, batch=2).components["decode"].program) == {}  # attention_mask input
    # the rewrite is a copy: the saved IR keeps the opset-exact mask
    copy, names = use_plugin_causal(growing)
    assert copy is not growing and _causal_nodes(copy) == len(names) == layers and _causal_nodes(growing) == 0


@pytest.mark.sweep  # (two more exports, ~20 s: the static cache's and Gemma 3's refusals in the sweep)
def test_the_proof_refuses_static_cache_slots_and_sliding_windows(llama, gemma3):
    static = GenerationConfig(cache_implementation="static", max_cache_len=64)
    assert proven_causal(_export(llama, cache=static).components["decode"].program) == {}  # slots, cache_position
    types = gemma3.config.get_text_config().layer_types
    assert "sliding_attention" in types and "full_attention" in types
    program = _export(gemma3).components["decode"].program
    assert sum(len(nodes) for nodes in proven_causal(program).values()) == types.count("full_attention")


def test_stateful_growing_cache_with_the_causal_flag_gives_eager_tokens(llama):
    exported = _export(llama)
    assert exported.components["prefill"] is exported.components["decode"]
    decode = exported.runner("decode")
    assert fused_with_state(decode.compiled, use_plugin_causal(decode.program)[1])  # the runner runs the flag
    got = exported.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, _eager(llama))
    # a multi-token call after a non-empty state (the prompt in two chunks): the fused kernel aligns causal to the
    # end of the keys, as the mask does
    positions = torch.arange(PROMPT.shape[1])[None]
    first = decode(input_ids=PROMPT[:, :10], position_ids=positions[:, :10],
                   past_key_values=Component(exported, "decode").initial_cache(1))
    second = decode(input_ids=PROMPT[:, 10:], position_ids=positions[:, 10:], past_key_values=first.past_key_values)
    with torch.no_grad():
        expected = llama(input_ids=PROMPT).logits
    torch.testing.assert_close(torch.cat([first.logits, second.logits], 1), expected, rtol=0, atol=1e-4)


def test_gemma3_past_its_sliding_window_gives_eager_tokens(gemma3):
    model = gemma3
    window = model.config.get_text_config().sliding_window
    assert PROMPT.shape[1] + NEW_TOKENS > 2 * window, window
    got = _export(model).generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, _eager(model))


@pytest.mark.sweep  # (a stateless export and a prompt-lookup generate, 40 s in the fresh clone of eccb237: the
# default suite's 25 minutes; the proof's refusal of padding stays in the default suite above)
def test_stateless_attention_keeps_its_mask_and_prompt_lookup_gives_eager_tokens(llama, monkeypatch):
    """The plugin's plain attention node aligns ``causal`` top-left: with the flag, this prompt lookup departs
    from eager's tokens (measured), so the runner keeps the mask where the attention is not fused with its state."""
    exported = _export(llama, stateful=False)
    decode = exported.runner("decode")
    rewritten, names = use_plugin_causal(decode.program)
    assert _causal_nodes(rewritten) == len(names) == llama.config.num_hidden_layers  # proven, but
    assert not fused_with_state(decode.compiled, names)  # not fused: the runner compiled the mask
    calls = []
    select = decode.select_inputs
    monkeypatch.setattr(decode, "select_inputs", lambda kwargs: calls.append(kwargs["input_ids"].shape[1])
                        or select(kwargs))
    got = exported.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=NEW_TOKENS,
                            prompt_lookup_num_tokens=3)
    assert torch.equal(got, _eager(llama, prompt_lookup_num_tokens=3))
    assert torch.equal(got, _eager(llama))
    assert max(calls) > 1, calls  # a multi-token call after a non-empty cache ran
