"""``generate(prompt_lookup_num_tokens=N)`` and ``generate(assistant_model=...)`` are eager's assisted decoding,
drafts verified by the multi-token decode graph in one call per block.

On a prompt that repeats itself, the tokens equal eager ``model.generate`` with the same arguments (greedy, with a
processor, and sampled with the same seed, whose tokens differ from plain sampling: the row can fail), in fewer
graph calls than new tokens where the drafts are good (prompt lookup; the model as its own assistant). An assistant
whose weights differ drafts worse tokens: sampled through transformers' speculative sampling, as eager does. Static multi-token and dynamic multi-token caches on Dynamo,
static multi-token on ONNX. Refused by name: a single-token decode graph, a batch of 2, a stateful runtime cache.
"""

from __future__ import annotations


import pytest
import torch
from transformers import GenerationConfig

from generation_cases import exporter_for
from hfexport import UnsupportedError
from hfexport.testing.tiny import TINY_CASES

NEW = 20
PROMPT = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7]])
ROWS = {
    "greedy": {"prompt_lookup_num_tokens": 3},
    "penalty": {"prompt_lookup_num_tokens": 5, "repetition_penalty": 0.5},
    "sampled": {"prompt_lookup_num_tokens": 3, "do_sample": True, "top_k": 5},
    "assistant-self": {"assistant_model": "self"},
    "assistant-other": {"assistant_model": "other", "repetition_penalty": 0.5},
    "assistant-sampled": {"assistant_model": "other", "do_sample": True, "top_k": 5},
}
GOOD_DRAFTS = ("greedy", "penalty", "assistant-self")
EXPORTS = [("dynamo", "static"), ("dynamo", "dynamic"), ("onnx", "static")]


@pytest.fixture(scope="module")
def model():
    return TINY_CASES["llama"].build()


@pytest.fixture(scope="module")
def assistants(model):
    other = TINY_CASES["llama"].build()
    with torch.no_grad(), torch.random.fork_rng():
        torch.manual_seed(1)
        for p in other.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return {"self": model, "other": other}


def _export(model, backend, cache, multi=True):
    gen = GenerationConfig(cache_implementation="static", max_cache_len=64) if cache == "static" else None
    sample = TINY_CASES["llama"].inputs(1, 6)
    exporter, config = exporter_for(backend)
    return exporter.export_for_generation(model, sample, config, generation_config=gen, multi_token_decode=multi)


@pytest.fixture(scope="module", params=EXPORTS, ids=[f"{b}-{c}" for b, c in EXPORTS])
def exported(request, model):
    return _export(model, *request.param)


def _eager(model, **kwargs):
    torch.manual_seed(0)
    with torch.no_grad():
        return model.generate(input_ids=PROMPT, max_new_tokens=NEW, **kwargs)


def _counted(exported, monkeypatch):
    calls = []
    for name in ("prefill", "decode"):
        runner = exported.runner(name)
        select = runner.select_inputs
        monkeypatch.setattr(runner, "select_inputs", lambda kwargs, _s=select: calls.append(1) or _s(kwargs))
        if exported.components["prefill"] is exported.components["decode"]:
            break
    return calls


@pytest.mark.parametrize("row", list(ROWS))
def test_assisted_decoding_gives_eager_assisted_tokens(row, exported, model, assistants, monkeypatch):
    kwargs = dict(ROWS[row])
    if "assistant_model" in kwargs:
        kwargs["assistant_model"] = assistants[kwargs["assistant_model"]]
    want = _eager(model, **kwargs)
    if kwargs.get("do_sample"):
        plain = _eager(model, **{k: v for k, v in kwargs.items() if k not in ("prompt_lookup_num_tokens",
                                                                              "assistant_model")})
        assert not torch.equal(want, plain), "the drafts do not change eager's sampled tokens"
    calls = _counted(exported, monkeypatch)
    torch.manual_seed(0)
    got = exported.generate(input_ids=PROMPT.clone(), max_new_tokens=NEW, **kwargs)
    assert torch.equal(got, want), (got[0, PROMPT.shape[1]:], want[0, PROMPT.shape[1]:])
    new = want.shape[1] - PROMPT.shape[1]
    if row in GOOD_DRAFTS:
        assert 0 < len(calls) < new, f"{len(calls)} graph calls for {new} tokens: no draft was accepted"


def test_assisted_decoding_refuses_what_it_cannot_verify(model):
    single = _export(model, "dynamo", "dynamic", multi=False)
    with pytest.raises(UnsupportedError, match="multi_token_decode=True"):
        single.generate(input_ids=PROMPT, max_new_tokens=4, prompt_lookup_num_tokens=3)
    multi = _export(model, "dynamo", "static")
    with pytest.raises(UnsupportedError, match="batch_size = 1"):
        multi.generate(input_ids=PROMPT.repeat(2, 1), max_new_tokens=4, prompt_lookup_num_tokens=3)
    with pytest.raises(ValueError, match="batch_size = 1"), torch.no_grad():  # as eager refuses it
        model.generate(input_ids=PROMPT.repeat(2, 1), max_new_tokens=4, prompt_lookup_num_tokens=3)
