"""``ExportedModel.generate(**kwargs)`` is ``model.generate(**kwargs)``: a table of generation arguments, each run on
the export and on eager with the same arguments (and the same torch seed when sampling), on a left-padded batch of 2.

Each row first checks that its arguments change eager's output against plain greedy decoding (or, for the rows
about scores, eager's scores), so that the comparison with the export can fail. The model is a tiny random Llama
with SmolLM2's vocabulary and tokenizer (stop strings need a real tokenizer). Exports: Dynamo with a dynamic cache,
ONNX static multi-token, OpenVINO dynamic (stateful); Dynamo's static cache, ONNX dynamic, OpenVINO static
multi-token and ExecuTorch static multi-token and dynamic run in ``make test-sweep``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from hfexport import UnsupportedError

NEW = 10
PROMPTS = ["The capital of France is", "Hello there, my good friend, how"]


class AddBias:
    """A user logits processor: pushes one token up."""

    def __init__(self, token: int):
        self.token = token

    def __call__(self, input_ids, scores):
        scores = scores.clone()
        scores[:, self.token] += 100.0
        return scores


class StopAfter:
    """A user stopping criterion: every row stops once the sequence reaches ``length``."""

    def __init__(self, length: int):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full((input_ids.shape[0],), input_ids.shape[-1] >= self.length, dtype=torch.bool)


@pytest.fixture(scope="module")
def llama(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.do_sample = False
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return dict(tokenizer(PROMPTS, return_tensors="pt", padding=True, padding_side="left"))


def _eager(model, prompts, **kwargs):
    with torch.no_grad():
        return model.generate(**copy.deepcopy(prompts), **kwargs)


@pytest.fixture(scope="module")
def greedy(llama, prompts):
    out = _eager(llama, prompts, max_new_tokens=NEW, do_sample=False)
    return out[:, prompts["input_ids"].shape[-1]:]


def _rows(greedy, tokenizer, prompts):
    """The table: (id, kwargs builder). A builder gets greedy's new tokens and returns the generate kwargs."""
    first, second, third = (int(greedy[0, i]) for i in range(3))
    return {
        # (a random model rarely repeats: a penalty below 1 makes it repeat, which the n-gram rule then forbids)
        "repetition_penalty": lambda: {"repetition_penalty": 0.05},
        "no_repeat_ngram_size": lambda: {"repetition_penalty": 0.05, "no_repeat_ngram_size": 1},
        "suppress_tokens": lambda: {"suppress_tokens": [first, second]},
        "begin_suppress_tokens": lambda: {"begin_suppress_tokens": [first, int(greedy[1, 0])]},
        "bad_words_ids": lambda: {"bad_words_ids": [[first], [second, third]]},
        "sequence_bias": lambda: {"sequence_bias": {(second,): 50.0}},
        "forced_eos_token_id": lambda: {"forced_eos_token_id": 7},
        "eos_list": lambda: {"eos_token_id": [third, 5]},
        "min_new_tokens": lambda: {"eos_token_id": second, "min_new_tokens": 6},
        "min_length": lambda: {"eos_token_id": second, "min_length": prompts["input_ids"].shape[-1] + 5},
        "max_length": lambda: {"max_length": prompts["input_ids"].shape[-1] + 4, "max_new_tokens": None},
        "exponential_decay_length_penalty": lambda: {"eos_token_id": 5,
                                                     "exponential_decay_length_penalty": (2, 50.0)},
        "logits_processor": lambda: {"logits_processor": [AddBias(third)]},
        "stopping_criteria": lambda: {"stopping_criteria": [StopAfter(prompts["input_ids"].shape[-1] + 3)]},
        "prefix_allowed_tokens_fn": lambda: {"prefix_allowed_tokens_fn": lambda b, ids: [third, 5, 6]},
        "stop_strings": lambda: {"stop_strings": [tokenizer.decode([second])], "tokenizer": tokenizer},
        "generation_config": lambda: {"generation_config": _config(repetition_penalty=0.05, max_new_tokens=NEW)},
        "sample": lambda: {"do_sample": True},
        "temperature": lambda: {"do_sample": True, "temperature": 0.3},
        "top_k": lambda: {"do_sample": True, "top_k": 3},
        "top_p": lambda: {"do_sample": True, "top_p": 0.5},
        "min_p": lambda: {"do_sample": True, "min_p": 0.5},
        "typical_p": lambda: {"do_sample": True, "typical_p": 0.3},
        "epsilon_cutoff": lambda: {"do_sample": True, "epsilon_cutoff": 3e-5},
        "eta_cutoff": lambda: {"do_sample": True, "eta_cutoff": 3e-5},
        "penalty_and_top_k": lambda: {"do_sample": True, "top_k": 5, "repetition_penalty": 2.0},
        "num_beams": lambda: {"num_beams": 2},
        "num_return_sequences": lambda: {"num_beams": 3, "num_return_sequences": 2},
        "length_penalty": lambda: {"num_beams": 3, "length_penalty": -2.0, "eos_token_id": third},
        "early_stopping": lambda: {"num_beams": 2, "early_stopping": True, "eos_token_id": second},
        "beams_with_penalty": lambda: {"num_beams": 2, "repetition_penalty": 0.05},
        "beams_stopping_criteria": lambda: {"num_beams": 2, "stopping_criteria": [
            StopAfter(prompts["input_ids"].shape[-1] + 3)]},
    }


# the output a row's arguments are checked to change (default: plain greedy decoding)
BASELINES = {"no_repeat_ngram_size": {"repetition_penalty": 0.05}, "beams_with_penalty": {"num_beams": 2},
             "beams_stopping_criteria": {"num_beams": 2}}

# rows about what generate returns beside the tokens: compared on scores / logits, not sequences
SCORE_ROWS = {
    "output_scores": {"return_dict_in_generate": True, "output_scores": True, "repetition_penalty": 3.0},
    "output_logits": {"return_dict_in_generate": True, "output_logits": True},
    "renormalize_logits": {"return_dict_in_generate": True, "output_scores": True, "renormalize_logits": True},
}

REFUSED = {
    "guidance_scale": ({"guidance_scale": 2.0}, "guidance_scale"),
    "penalty_alpha": ({"penalty_alpha": 0.6, "top_k": 4}, "contrastive search"),
    "output_attentions": ({"return_dict_in_generate": True, "output_attentions": True}, "output_attentions"),
    "output_hidden_states": ({"return_dict_in_generate": True, "output_hidden_states": True}, "hidden states"),
    "assistant_model": ({"assistant_model": object()},
                        "assistant_model= takes an eager transformers model or an ExportedModel"),
}


def _config(**kwargs):
    from transformers import GenerationConfig

    return GenerationConfig(do_sample=False, **kwargs)


EXPORTS = [("dynamo", "dynamic"), ("onnx", "static"), ("openvino", "dynamic")]
SWEEP_EXPORTS = [("dynamo", "static"), ("onnx", "dynamic"), ("openvino", "static"), ("executorch", "static"), ("executorch", "dynamic")]


@pytest.fixture(scope="module", params=[pytest.param(e, id=f"{e[0]}-{e[1]}") for e in EXPORTS] + [
    pytest.param(e, id=f"{e[0]}-{e[1]}", marks=pytest.mark.sweep) for e in SWEEP_EXPORTS])
def exported(request, llama, prompts):
    from hfexport import AutoExportConfig, AutoHfExporter

    backend, cache = request.param
    pytest.importorskip({"dynamo": "torch", "onnx": "onnxruntime", "openvino": "openvino",
                         "executorch": "executorch"}[backend])
    config = AutoExportConfig.from_dict({"export_format": backend, "dynamic": True})
    gen = _config(cache_implementation="static", max_cache_len=64) if cache == "static" else None
    return AutoHfExporter.from_config(config).export_for_generation(
        llama, copy.deepcopy(prompts), config, generation_config=gen, multi_token_decode=cache == "static")


ROW_IDS = ["repetition_penalty", "no_repeat_ngram_size", "suppress_tokens", "begin_suppress_tokens",
           "bad_words_ids", "sequence_bias", "forced_eos_token_id", "eos_list", "min_new_tokens", "min_length",
           "max_length", "exponential_decay_length_penalty", "logits_processor", "stopping_criteria",
           "prefix_allowed_tokens_fn", "stop_strings", "generation_config", "sample", "temperature", "top_k", "top_p",
           "min_p", "typical_p", "epsilon_cutoff", "eta_cutoff", "penalty_and_top_k", "num_beams",
           "num_return_sequences", "length_penalty", "early_stopping", "beams_with_penalty", "beams_stopping_criteria"]


# exports whose graphs pin the batch: ExecuTorch keeps a static cache in the program's buffers, fixed in shape
FIXED_BATCH = {("executorch", "static"): 2}


def _fixed_batch(exported, prompts):
    """Whether beam search is refused on this export, before the first step, for its fixed batch (checked here)."""
    fmt = str(getattr(exported.export_format, "value", exported.export_format))
    cache = "static" if exported.generation_config.cache_implementation == "static" else "dynamic"
    fixed = FIXED_BATCH.get((fmt, cache))
    if fixed is None:
        return False
    with pytest.raises(UnsupportedError, match=f"fixed batch of {fixed} rows.*re-export with a sample batch of 4"):
        exported.generate(**copy.deepcopy(prompts), max_new_tokens=NEW, num_beams=2)
    return True


@pytest.mark.parametrize("row", ROW_IDS)
def test_generate_argument_gives_model_generate_output(row, exported, llama, prompts, greedy, tokenizer):
    kwargs = _rows(greedy, tokenizer, prompts)[row]()
    call = {"max_new_tokens": NEW, **kwargs}
    call = {k: v for k, v in call.items() if v is not None}
    torch.manual_seed(1)
    expected = _eager(llama, prompts, **call)
    prompt_len = prompts["input_ids"].shape[-1]
    if row in BASELINES:
        base = _eager(llama, prompts, max_new_tokens=NEW, **BASELINES[row])[:, prompt_len:]
    else:
        base = greedy if expected.shape[0] == greedy.shape[0] else greedy.repeat_interleave(
            expected.shape[0] // greedy.shape[0], 0)
    new = expected[:, prompt_len:]
    assert new.shape != base.shape or not torch.equal(new, base), f"{row} does not change eager's tokens"
    if "num_beams" in kwargs and _fixed_batch(exported, prompts):
        return
    torch.manual_seed(1)
    got = exported.generate(**copy.deepcopy(prompts), **call)
    assert isinstance(got, torch.Tensor) and got.shape == expected.shape, (got.shape, expected.shape)
    assert torch.equal(got, expected), f"\neager:    {expected[:, prompt_len:]}\nexported: {got[:, prompt_len:]}"


@pytest.mark.parametrize("row", list(SCORE_ROWS))
def test_generate_returns_model_generate_output_type_and_scores(row, exported, llama, prompts):
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    call = {"max_new_tokens": NEW, **SCORE_ROWS[row]}
    expected = _eager(llama, prompts, **call)
    field = "logits" if row == "output_logits" else "scores"
    if row == "output_logits":  # asked for, they come back; not asked for, they do not
        assert _eager(llama, prompts, max_new_tokens=NEW, return_dict_in_generate=True).logits is None
    else:  # the processors (or the renormalisation) make the scores differ from the raw logits
        plain = _eager(llama, prompts, max_new_tokens=NEW, return_dict_in_generate=True, output_logits=True)
        assert not torch.allclose(torch.stack(expected.scores), torch.stack(plain.logits)), \
            f"{row} does not change eager's scores"
    got = exported.generate(**copy.deepcopy(prompts), **call)
    assert type(got) is GenerateDecoderOnlyOutput
    assert torch.equal(got.sequences, expected.sequences)
    want, have = torch.stack(getattr(expected, field)), torch.stack(getattr(got, field))
    finite = torch.isfinite(want)
    assert torch.equal(finite, torch.isfinite(have))
    assert (want[finite] - have[finite]).abs().max() <= 1e-3  # fp32 logits through another runtime
    other = "scores" if field == "logits" else "logits"
    assert getattr(got, other) is None and getattr(expected, other) is None


class RecordScores:
    """A user stopping criterion that records what it is handed as ``scores`` (and never stops)."""

    def __init__(self):
        self.seen = []

    def __call__(self, input_ids, scores, **kwargs):
        self.seen.append(None if scores is None else (type(scores).__name__, len(scores), scores[-1].shape))
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


@pytest.mark.parametrize("kept", [False, True], ids=["scores-not-kept", "scores-kept"])
def test_stopping_criteria_get_the_scores_model_generate_hands_them(kept, exported, llama, prompts):
    """``_sample`` hands the criteria the scores kept so far (a tuple growing by one a step), or None when
    ``output_scores`` is off; a criterion reading them (as transformers' ConfidenceCriteria does) sees the same."""
    call = {"max_new_tokens": 4, "return_dict_in_generate": kept, "output_scores": kept}
    eager, export = RecordScores(), RecordScores()
    _eager(llama, prompts, stopping_criteria=[eager], **call)
    exported.generate(**copy.deepcopy(prompts), stopping_criteria=[export], **call)
    assert export.seen == eager.seen and len(eager.seen) == 4
    assert (eager.seen[-1] is None) != kept


@pytest.mark.parametrize("row", list(REFUSED))
def test_an_argument_generate_cannot_honour_is_refused_by_name(row, exported, prompts):
    kwargs, message = REFUSED[row]
    with pytest.raises(UnsupportedError, match=message):
        exported.generate(**copy.deepcopy(prompts), max_new_tokens=NEW, **kwargs)


def test_model_inputs_generate_does_not_know_are_refused_as_model_generate_refuses_them(exported, llama, prompts):
    with pytest.raises(ValueError, match="not_an_input"):
        _eager(llama, prompts, max_new_tokens=NEW, not_an_input=3)
    with pytest.raises(ValueError, match="not_an_input"):
        exported.generate(**copy.deepcopy(prompts), max_new_tokens=NEW, not_an_input=3)


BEAM_DICT = {"num_beams": 3, "num_return_sequences": 2, "return_dict_in_generate": True, "output_scores": True,
             "output_logits": True, "repetition_penalty": 0.05}


def test_beam_search_returns_model_generate_beam_output(exported, llama, prompts, greedy):
    from transformers.generation.utils import GenerateBeamDecoderOnlyOutput

    expected = _eager(llama, prompts, max_new_tokens=NEW, **BEAM_DICT)
    prompt_len = prompts["input_ids"].shape[-1]
    beams_new = expected.sequences[::2, prompt_len:]
    assert beams_new.shape != greedy.shape or not torch.equal(beams_new, greedy), "beam search gives greedy's tokens"
    if _fixed_batch(exported, prompts):  # one prompt, 2 beams: the fixed batch of 2, the cache kept in the program
        one = {k: v[1:] for k, v in prompts.items()}
        call = dict(BEAM_DICT, num_beams=2, num_return_sequences=1)
        expected = _eager(llama, one, max_new_tokens=NEW, **call)
        got = exported.generate(**copy.deepcopy(one), max_new_tokens=NEW, **call)
        assert torch.equal(got.sequences, expected.sequences) and torch.equal(got.beam_indices, expected.beam_indices)
        assert expected.beam_indices.max() > 0, "the beams never swap: the cache reorder is not exercised"
        assert exported.runner("decode").stateful, "the cache is kept in the program: reordered in its buffers"
        return
    got = exported.generate(**copy.deepcopy(prompts), max_new_tokens=NEW, **BEAM_DICT)
    assert type(got) is GenerateBeamDecoderOnlyOutput
    assert torch.equal(got.sequences, expected.sequences)
    assert torch.equal(got.beam_indices, expected.beam_indices)
    torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, atol=1e-3, rtol=1e-4)
    for field in ("scores", "logits"):
        want, have = torch.stack(getattr(expected, field)), torch.stack(getattr(got, field))
        finite = torch.isfinite(want)
        assert torch.equal(finite, torch.isfinite(have)), field
        assert (want[finite] - have[finite]).abs().max() <= 1e-3, field  # fp32 logits through another runtime
    assert got.past_key_values is None
