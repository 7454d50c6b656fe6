"""``generate(prompt_lookup_num_tokens=N)`` and ``generate(assistant_model=...)`` are eager's assisted decoding,
drafts verified by the multi-token decode graph in one call per block.

On a prompt that repeats itself, the tokens equal eager ``model.generate`` with the same arguments (greedy, with a
processor, and sampled with the same seed, whose tokens differ from plain sampling: the row can fail), in fewer
graph calls than new tokens where the drafts are good (prompt lookup; the model as its own assistant). An assistant
whose weights differ drafts worse tokens: sampled through transformers' speculative sampling, as eager does. Static multi-token and dynamic multi-token caches on Dynamo,
static multi-token on ONNX. Refused by name: a single-token decode graph, a batch of 2, a stateful runtime cache. The assistant can be an export
too (Dynamo dynamic multi-token, ONNX static single-token): its drafts, scores and sampled tokens equal the eager
assistant's. With ``return_dict_in_generate`` the output is eager's, scores and raw logits per kept token.
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
# the assistant as an export of the same weights as the eager one: Dynamo with a dynamic cache and a multi-token
# decode graph (a block per call), ONNX with a static cache and a single-token decode graph (a token per call)
# (verified by one main export: the Dynamo static multi-token one)
EXPORTED_ROWS = {
    "exported-self": {"assistant_model": "exported-self"},
    "exported-other": {"assistant_model": "exported-other", "repetition_penalty": 0.5},
    "exported-other-sampled": {"assistant_model": "exported-other", "do_sample": True, "top_k": 5},
    "exported-onnx-sampled": {"assistant_model": "exported-onnx-other", "do_sample": True, "top_k": 5},
}
GOOD_DRAFTS = ("greedy", "penalty", "assistant-self", "exported-self")
# the eager assistant an exported one is compared with
EAGER_TWIN = {"exported-self": "self", "exported-other": "other", "exported-onnx-other": "other"}
# (Dynamo's static cache in the sweep, for the suite's time: ONNX's static cache takes that path by default)
EXPORTS = [pytest.param(("dynamo", "static"), marks=pytest.mark.sweep, id="dynamo-static"),
           pytest.param(("dynamo", "dynamic"), id="dynamo-dynamic"), pytest.param(("onnx", "static"), id="onnx-static")]


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


@pytest.fixture(scope="module")
def exported_assistants(assistants):
    return {"exported-self": _export(assistants["self"], "dynamo", "dynamic"),
            "exported-other": _export(assistants["other"], "dynamo", "dynamic"),
            "exported-onnx-other": _export(assistants["other"], "onnx", "static", multi=False)}


def _export(model, backend, cache, multi=True):
    gen = GenerationConfig(cache_implementation="static", max_cache_len=64) if cache == "static" else None
    sample = TINY_CASES["llama"].inputs(1, 6)
    exporter, config = exporter_for(backend)
    return exporter.export_for_generation(model, sample, config, generation_config=gen, multi_token_decode=multi)


@pytest.fixture(scope="module", params=EXPORTS)
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


@pytest.fixture(scope="module")
def dynamic_main(model):
    return _export(model, "dynamo", "dynamic")


@pytest.mark.parametrize("row", list(ROWS))
def test_assisted_decoding_gives_eager_assisted_tokens(row, exported, model, assistants, exported_assistants,
                                                       monkeypatch):
    _check_row(ROWS[row], row, exported, model, assistants, exported_assistants, monkeypatch)


@pytest.mark.parametrize("row", list(EXPORTED_ROWS))
def test_an_exported_assistant_drafts_as_the_eager_one(row, model, assistants, exported_assistants, monkeypatch):
    """The drafts of an exported assistant are the eager twin's: greedy tokens in fewer calls, and sampled tokens
    (speculative sampling reads the drafts' scores) equal to eager's with the eager twin as assistant."""
    exported = _export(model, "dynamo", "static")
    _check_row(EXPORTED_ROWS[row], row, exported, model, assistants, exported_assistants, monkeypatch)


def _check_row(row_kwargs, row, exported, model, assistants, exported_assistants, monkeypatch):
    kwargs = dict(row_kwargs)
    name = kwargs.get("assistant_model")
    if name is not None:
        kwargs["assistant_model"] = assistants[EAGER_TWIN.get(name, name)]
    want = _eager(model, **kwargs)
    if name in exported_assistants:
        kwargs["assistant_model"] = exported_assistants[name]
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


def test_assisted_return_dict_is_eager_output(model, dynamic_main, assistants, exported_assistants):
    """``return_dict_in_generate`` gives ``_assisted_decoding``'s output: a processed score and a raw logit row per
    kept token (the penalty makes them differ), with an eager and with an exported assistant."""
    exported = dynamic_main
    call = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True,
            "repetition_penalty": 0.5}
    for drafts, assistant in ((dict(prompt_lookup_num_tokens=3), None), ({}, "self"), ({}, "exported-self")):
        want = _eager(model, **call, **drafts, **({"assistant_model": assistants[EAGER_TWIN.get(assistant,
                                                                                                   assistant)]}
                                                  if assistant else {}))
        if assistant:
            drafts = {"assistant_model": exported_assistants.get(assistant, assistants.get(assistant))}
        got = exported.generate(input_ids=PROMPT.clone(), max_new_tokens=NEW, **call, **drafts)
        assert type(got) is type(want) and type(want).__name__ == "GenerateDecoderOnlyOutput"
        assert torch.equal(got.sequences, want.sequences)
        assert len(got.scores) == len(want.scores) == want.sequences.shape[1] - PROMPT.shape[1]
        assert not torch.allclose(want.scores[0], want.logits[0]), "the penalty does not change the scores"
        for g, w in zip(got.scores + got.logits, want.scores + want.logits):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)


def test_an_exported_assistant_carries_its_heuristic_schedule(model, dynamic_main, assistants, exported_assistants):
    """With ``num_assistant_tokens_schedule="heuristic"`` eager writes the adapted number of drafts into the
    assistant's generation config at the end of the call; an exported assistant's config gets the same number."""
    eager_assistant, exported_assistant = assistants["self"], exported_assistants["exported-self"]
    saved = [m.generation_config.to_dict() for m in (eager_assistant, exported_assistant)]
    try:
        for m in (eager_assistant, exported_assistant):
            m.generation_config.num_assistant_tokens_schedule = "heuristic"
            m.generation_config.num_assistant_tokens = 2
        _eager(model, assistant_model=eager_assistant)
        dynamic_main.generate(input_ids=PROMPT.clone(), max_new_tokens=NEW, assistant_model=exported_assistant)
        assert eager_assistant.generation_config.num_assistant_tokens != 2, "eager did not adapt the schedule"
        assert exported_assistant.generation_config.num_assistant_tokens == \
            eager_assistant.generation_config.num_assistant_tokens
    finally:
        from transformers import GenerationConfig

        eager_assistant.generation_config = GenerationConfig.from_dict(saved[0])
        exported_assistant.generation_config = GenerationConfig.from_dict(saved[1])


def test_an_exported_assistant_too_small_for_the_call_is_refused(dynamic_main, assistants):
    main = dynamic_main
    small = _export(assistants["self"], "dynamo", "static")  # 64 positions
    with pytest.raises(UnsupportedError, match="max_cache_len >= 70"):
        main.generate(input_ids=PROMPT.clone(), max_new_tokens=57, assistant_model=small)


def test_a_stateful_export_is_refused_as_main_model_and_as_assistant(model, dynamic_main):
    """OpenVINO keeps a stateful export's cache in the runtime's variables, which cannot be rolled back past the
    rejected drafts: refused by name, whichever side it is on."""
    stateful = _export(model, "openvino", "static")
    assert stateful.runner("decode").stateful
    with pytest.raises(UnsupportedError, match="this export keeps its cache inside the runtime"):
        stateful.generate(input_ids=PROMPT.clone(), max_new_tokens=4, prompt_lookup_num_tokens=3)
    with pytest.raises(UnsupportedError, match="the assistant export keeps its cache inside the runtime"):
        dynamic_main.generate(input_ids=PROMPT.clone(), max_new_tokens=4, assistant_model=stateful)
