"""A static KV cache kept inside the ExecuTorch program (mutable buffers): the method takes no cache tensors, the
state it carries equals eager PyTorch's cache, a new cache object starts a new sequence, and the runtime call runs
torch's own work on one thread (restoring the caller's setting).

One tiny-Llama ``export_for_generation`` (static cache, multi-token decode) is shared by the module.
"""

from __future__ import annotations

import copy

import pytest
import torch

from hfexport import ExecutorchConfig
from hfexport.metadata import IORole
from hfexport.testing.tiny import TINY_CASES

pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")

CACHE_LEN = 32


@pytest.fixture(scope="module")
def stateful():
    from hfexport.exporter_executorch import ExecutorchExporter

    case = TINY_CASES["llama"]
    model = case.build()
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample, gen.cache_implementation, gen.max_cache_len = False, "static", CACHE_LEN
    sample = {k: v[:1] for k, v in case.inputs(1, 6, padded=False).items()}
    exported = ExecutorchExporter().export_for_generation(model, sample, ExecutorchConfig(dynamic=True),
                                                          generation_config=gen, multi_token_decode=True)
    return case, model, gen, exported


def _eager_cache(model):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=CACHE_LEN)


def test_the_cache_lives_in_the_program_not_in_its_inputs(stateful):
    _, model, _, exported = stateful
    metadata = exported.components["decode"].metadata
    state = [s for s in metadata.inputs if s.role is IORole.STATE]
    layers = model.config.num_hidden_layers
    # a batch-1 unpadded Llama takes the llama custom-op path: the write counters are kept in the program too
    assert metadata.kwargs["past_key_values"].get("state_layout") == "bshd"
    assert sorted(s.name for s in state) == sorted(
        f"past_key_values.layers.{i}.{kind}" for i in range(layers) for kind in ("keys", "values", "cumulative_length"))
    meta = exported.runner("decode").method.metadata
    fed = [s for s in metadata.inputs if s.role is not IORole.STATE]
    assert meta.num_inputs() == len(fed), "the method takes the cache's key/value tensors as inputs"
    # outputs: the logits only, no cache-sized tensor
    sizes = [tuple(meta.output_tensor_meta(i).sizes()) for i in range(meta.num_outputs())]
    assert all(len(s) != 4 for s in sizes), sizes
    assert [s.role for s in metadata.outputs] == [IORole.OUTPUT]


def test_state_after_a_prefill_equals_eagers_cache_and_the_call_returns_the_callers_cache(stateful):
    case, model, _, exported = stateful
    ids = case.inputs(1, 7, padded=False)["input_ids"]
    positions = torch.arange(7)[None]
    mask = torch.ones(1, 1, 7, CACHE_LEN, dtype=torch.bool).tril(diagonal=0)
    mask[..., 7:] = False
    runner = exported.runner("decode")
    from hfexport.generation.loop import Component as _Component

    cache = _Component(exported, "decode").initial_cache(1)  # an empty cache shaped like the traced one
    out = runner(input_ids=ids, past_key_values=cache, position_ids=positions, attention_mask=mask)
    assert out.past_key_values is cache, "the call returns the cache object it was given (it stands for the state)"
    eager_cache = _eager_cache(model)
    with torch.no_grad():
        eager = model(input_ids=ids, past_key_values=eager_cache, position_ids=positions, use_cache=True)
    torch.testing.assert_close(out.logits, eager.logits, atol=1e-4, rtol=1e-4)
    state = runner.state()
    for i, layer in enumerate(eager_cache.layers):
        torch.testing.assert_close(state[f"past_key_values.layers.{i}.keys"][..., :7, :], layer.keys[..., :7, :],
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(state[f"past_key_values.layers.{i}.values"][..., :7, :],
                                   layer.values[..., :7, :], atol=1e-4, rtol=1e-4)
        assert int(cache.layers[i].cumulative_length) == 7, "the caller's counters follow the program's"


def test_each_generate_starts_a_new_sequence(stateful):
    """Two prompts in a row, each giving eager's tokens: the second generate loads its own empty cache into the
    program instead of continuing the first one's state."""
    case, model, gen, exported = stateful
    for seq in (7, 5):
        inputs = case.inputs(1, seq, padded=False)
        ids, mask = inputs["input_ids"], torch.ones_like(inputs["input_ids"])
        with torch.no_grad():
            expected = model.generate(ids, attention_mask=mask, max_new_tokens=10, generation_config=gen)
        got = exported.generate(input_ids=ids, attention_mask=mask, max_new_tokens=10)
        assert got.tolist() == expected.tolist()


def test_the_runtime_call_runs_torch_on_one_thread_and_restores_it(stateful, monkeypatch):
    case, _, _, exported = stateful
    runner = exported.runner("decode")
    seen = []
    execute = runner.method.execute

    def spy(feed):
        seen.append(torch.get_num_threads())
        return execute(feed)

    monkeypatch.setattr(runner.method, "execute", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ids = case.inputs(1, 4, padded=False)["input_ids"]
        exported.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}, seen
