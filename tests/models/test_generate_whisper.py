"""Whisper's own generate over every backend: a tiny Whisper with a real-style generation config.

The config is what a Hub checkpoint ships (``hfexport.testing.tiny_whisper``): ``forced_decoder_ids`` with the
language left to detection, ``lang_to_id`` / ``task_to_id``, ``<|notimestamps|>``, suppressed and begin-suppressed
tokens, pad = EOS. ``ExportedModel.generate`` must return ``model.generate``'s ids for each call below: the decoder
prompt and the EOS stripped, the language detected or given, the task, timestamps, a long-form (segmented) input,
the temperature fallback, an English-only config passed at the call, and ``return_dict_in_generate`` with scores;
then beam search (``num_beams``, with a language, several returned sequences, scores and logits, long-form audio),
each row checked to swap beams in eager so the cache reorder runs. Each row first checks that its
arguments change eager's output, so the comparison can fail.

Static and dynamic cache on Dynamo, ONNX, OpenVINO and ExecuTorch; the default suite runs one cache per backend
(ExecuTorch's in the sweep), and the beam rows on Dynamo's static cache too; the sweep the rest.
"""

from __future__ import annotations

import copy

import pytest
import torch

from generation_cases import exporter_for
from hfexport import UnsupportedError
from hfexport.testing.tiny import TINY_CASES
from hfexport.testing.tiny_multimodal import WHISPER_FRAMES, WHISPER_MEL_BINS
from hfexport.testing.tiny_whisper import WHISPER_SPECIAL, whisper_generation_config

NEW_TOKENS = 12
SHORT = torch.randn(2, WHISPER_MEL_BINS, WHISPER_FRAMES, generator=torch.Generator().manual_seed(1))
# 2.5 segments of 30 "seconds" (the tiny encoder's window is 32 frames): Whisper's long-form loop, with timestamps
LONG = torch.randn(1, WHISPER_MEL_BINS, 80, generator=torch.Generator().manual_seed(3))

# id -> (features, the call's arguments, the arguments of the eager call they must change)
ROWS = {
    "detected-language": (SHORT, {}, {"generation_config": None}),
    "language": (SHORT, {"language": "fr"}, {}),
    "language-task": (SHORT, {"language": "de", "task": "translate"}, {"language": "de"}),
    "timestamps": (SHORT, {"return_timestamps": True}, {}),
    "eos-stripped": (SHORT, {"eos_token_id": 4}, {}),
    "english-only-config": (SHORT, {"generation_config": "english"}, {}),
    "temperature-fallback": (SHORT, {"temperature": (0.0, 0.4), "logprob_threshold": -0.5,
                                     "compression_ratio_threshold": 1.2}, {}),
    "long-form": (LONG, {"return_timestamps": True}, {"return_timestamps": True, "generation_config": None}),
    "scores": (SHORT, {"return_dict_in_generate": True, "output_scores": True}, {}),
}

BACKENDS = ("dynamo", "onnx", "openvino", "executorch")
# ExecuTorch runs in the sweep (its Whisper export is ~80 s; the default suite has Whisper on ExecuTorch in
# test_generate_executorch.py)
DEFAULT = {("dynamo", "dynamic"), ("onnx", "static"), ("openvino", "dynamic")}


@pytest.fixture(scope="module")
def model():
    model = TINY_CASES["whisper"].build()
    model.generation_config = whisper_generation_config()
    return model


_EXPORTS: dict = {}


def _exported(model, backend, cache):
    key = (backend, cache)
    if key not in _EXPORTS:
        exporter, config = exporter_for(backend)
        gen = copy.deepcopy(model.generation_config)
        if cache == "static":
            gen.cache_implementation, gen.max_cache_len = "static", 64
        _EXPORTS[key] = exporter.export_for_generation(model, {"input_features": SHORT}, config, generation_config=gen)
    return _EXPORTS[key]


def _resolve(kwargs):
    out = copy.deepcopy(kwargs)
    if out.get("generation_config") == "english":
        out["generation_config"] = whisper_generation_config(multilingual=False)
    elif "generation_config" in out and out["generation_config"] is None:
        out["generation_config"] = copy.deepcopy(TINY_CASES["whisper"].build().generation_config)  # no Whisper fields
    return out


def _eager(model, features, kwargs):
    torch.manual_seed(0)
    with torch.no_grad():
        return model.generate(input_features=features, max_new_tokens=NEW_TOKENS, **_resolve(kwargs))


def _ids(out):
    return out if isinstance(out, torch.Tensor) else out.sequences


CASES = [pytest.param(b, c, r, id=f"{b}-{c}-{r}", marks=[] if (b, c) in DEFAULT else [pytest.mark.sweep])
         for b in BACKENDS for c in ("static", "dynamic") for r in ROWS]


@pytest.mark.parametrize("backend,cache,row", CASES)
def test_whisper_generate_equals_model_generate(model, backend, cache, row):
    features, kwargs, baseline = ROWS[row]
    want = _eager(model, features, kwargs)
    other = _eager(model, features, baseline)
    changed = type(want) is not type(other) or _ids(want).shape != _ids(other).shape or \
        not torch.equal(_ids(want), _ids(other))
    assert changed, f"{kwargs} does not change eager's output against {baseline}: the row could not fail"
    exported = _exported(model, backend, cache)
    torch.manual_seed(0)
    got = exported.generate(input_features=features, max_new_tokens=NEW_TOKENS, **_resolve(kwargs))
    assert type(got) is type(want)
    assert torch.equal(_ids(got), _ids(want)), (_ids(got), _ids(want))
    if row == "scores":
        assert len(got.scores) == len(want.scores) == NEW_TOKENS
        for a, b in zip(got.scores, want.scores):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)  # -inf where suppressed, on both sides
    if row == "detected-language":  # the prompt Whisper built: start, detected language, transcribe, no timestamps
        full = exported.generate(input_features=features, max_new_tokens=2, return_dict_in_generate=True).sequences
        assert full[:, 0].eq(WHISPER_SPECIAL["<|startoftranscript|>"]).all()
        assert full[:, 2].eq(WHISPER_SPECIAL["<|transcribe|>"]).all()
        assert full[:, 3].eq(WHISPER_SPECIAL["<|notimestamps|>"]).all()


# beam search: id -> (features, the beam call's arguments, the same call without beams, which they must change)
_DICT = {"return_dict_in_generate": True, "output_scores": True, "output_logits": True}
BEAM_ROWS = {
    "beams": (SHORT, {"num_beams": 3}, {}),
    "beams-language": (SHORT, {"num_beams": 3, "language": "fr"}, {"language": "fr"}),
    # Whisper repeats each clip per returned sequence, then beams: 2 x 2 x 2 rows (ExecuTorch's batch bound is 8)
    "beams-return-sequences": (SHORT, {"num_beams": 2, "num_return_sequences": 2}, {}),
    "beams-dict": (SHORT, {"num_beams": 3, **_DICT}, _DICT),
    "beams-long-form": (LONG, {"num_beams": 2, "return_timestamps": True}, {"return_timestamps": True}),
}
# the exports the default suite makes anyway, and Dynamo's static cache
BEAM_DEFAULT = DEFAULT | {("dynamo", "static")}
BEAM_CASES = [pytest.param(b, c, r, id=f"{b}-{c}-{r}", marks=[] if (b, c) in BEAM_DEFAULT else [pytest.mark.sweep])
              for b in BACKENDS for c in ("static", "dynamic") for r in BEAM_ROWS]


def _beam_indices(out):
    """Every beam index a dict output holds: the call's, or each long-form segment's."""
    if hasattr(out, "beam_indices"):
        return out.beam_indices.flatten()
    return torch.cat([s["result"]["beam_indices"].flatten() for segments in out["segments"] for s in segments])


@pytest.mark.parametrize("backend,cache,row", BEAM_CASES)
def test_whisper_beam_search_equals_model_generate(model, backend, cache, row):
    """``generate(num_beams=...)``: Whisper's generate over beam segments, as eager's (ids, or
    ``GenerateBeamEncoderDecoderOutput`` with sequences_scores, scores, logits and beam_indices)."""
    features, kwargs, greedy = BEAM_ROWS[row]
    want = _eager(model, features, kwargs)
    other = _eager(model, features, greedy)
    assert _ids(want).shape != _ids(other).shape or not torch.equal(_ids(want), _ids(other)), \
        f"{row}: eager's beams give greedy's tokens"
    twin = want if not isinstance(want, torch.Tensor) else _eager(model, features, dict(kwargs, **_DICT))
    beams = kwargs["num_beams"]
    indices = _beam_indices(twin)
    assert (indices[indices >= 0] % beams > 0).any(), f"{row}: the beams never swap: no cache reorder exercised"
    exported = _exported(model, backend, cache)
    torch.manual_seed(0)
    got = exported.generate(input_features=features, max_new_tokens=NEW_TOKENS, **_resolve(kwargs))
    assert type(got) is type(want)
    assert torch.equal(_ids(got), _ids(want)), (_ids(got), _ids(want))
    if isinstance(want, torch.Tensor):
        return
    assert torch.equal(got.beam_indices, want.beam_indices)
    torch.testing.assert_close(got.sequences_scores, want.sequences_scores, atol=1e-4, rtol=1e-4)
    for field in ("scores", "logits"):
        assert len(getattr(got, field)) == len(getattr(want, field)) == NEW_TOKENS
        for a, b in zip(getattr(got, field), getattr(want, field)):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)  # -inf where suppressed, on both sides


def test_token_timestamps_are_refused(model):
    exported = _exported(model, "dynamo", "dynamic")
    with pytest.raises(UnsupportedError, match="return_token_timestamps.*cross-attentions"):
        exported.generate(input_features=SHORT, return_token_timestamps=True)
