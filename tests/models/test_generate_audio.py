"""Audio-text-to-text prompts through ``ExportedModel.generate``: a tiny Qwen2-Audio, Voxtral, Audio Flamingo 3, GLM-ASR,
MOSS Transcribe Diarize and FunASR-Nano, their audio tower, projector and language model exported as parts, the audio features
merged over the prompt's audio tokens as each model's forward merges them (Qwen2-Audio: padded clips masked in the
tower, each clip's real frames kept; Voxtral: every clip whole, frames stacked by four, clip after clip; the other
four: a padded clip keeps the positions its real frames make), token for token against eager ``model.generate``;
Nemotron 3.5 Transcribe and Music Flamingo, which hfexport has no glue for, with their own ``get_audio_features`` as
one exported part. Each prompt is first checked to change eager's tokens against the same text without the audio.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from generation_cases import exporter_for
from hfexport import UnsupportedError
from hfexport.testing.tiny_audio import AUDIO_ID, qwen2_audio, qwen2_audio_inputs, voxtral, voxtral_inputs

NEW = 10
# real frames per clip: one full clip; a left-padded batch of a short and a full clip; two short clips
PROMPTS = {"full-clip": [32], "short-and-full": [24, 32], "two-short": [12, 28]}


@pytest.fixture(scope="module")
def model():
    return qwen2_audio()


_EXPORTS: dict = {}


def _exported(model, backend, sample=None):
    """One export per model family and backend, shared by the file's tests. ``sample``: the inputs traced with
    (default: Qwen2-Audio's, a padded clip among them, so the tower is traced with its mask)."""
    key = (model.config.model_type, backend)
    if key not in _EXPORTS:
        exporter, config = exporter_for(backend)
        _EXPORTS[key] = exporter.export_for_generation(model, sample or qwen2_audio_inputs([20, 32]), config)
    return _EXPORTS[key]


@pytest.mark.parametrize("backend", ["dynamo", pytest.param("onnx", marks=pytest.mark.sweep)])
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_audio_prompt_generates_like_eager(model, backend, prompt):
    _assert_like_eager(model, _exported(model, backend), qwen2_audio_inputs(PROMPTS[prompt], seed=1))


def _assert_like_eager(model, exported, inputs, audio_id=AUDIO_ID, part="audio_encoder"):
    start = inputs["input_ids"].shape[1]
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
        plain = model.generate(input_ids=inputs["input_ids"].masked_fill(inputs["input_ids"] == audio_id, 5),
                               attention_mask=inputs["attention_mask"], max_new_tokens=NEW, do_sample=False)
    assert not torch.equal(want[:, start:], plain[:, start:]), "the audio does not change eager's tokens"
    assert part in exported.components, sorted(exported.components)
    got = exported.generate(**inputs, max_new_tokens=NEW)
    assert torch.equal(got, want), (got[:, start:], want[:, start:])


# clips per row: one clip; one prompt with two clips (a long audio's chunks); a left-padded batch of one and two
VOXTRAL_PROMPTS = {"one-clip": [1], "two-clips": [2], "padded-batch-of-2": [1, 2]}


@pytest.fixture(scope="module")
def voxtral_model():
    return voxtral()


def _voxtral_exported(model, backend):
    # two rows of one clip each: the tower's clip dimension and the text batch are traced dynamic
    return _exported(model, backend, voxtral_inputs([1, 1]))


@pytest.mark.parametrize("backend", ["dynamo", pytest.param("onnx", marks=pytest.mark.sweep)])
@pytest.mark.parametrize("prompt", list(VOXTRAL_PROMPTS))
def test_voxtral_audio_prompt_generates_like_eager(voxtral_model, backend, prompt):
    _assert_like_eager(voxtral_model, _voxtral_exported(voxtral_model, backend),
                       voxtral_inputs(VOXTRAL_PROMPTS[prompt], seed=1))


def test_voxtral_refuses_an_audio_mask_as_eager_does(voxtral_model):
    # VoxtralForConditionalGeneration.forward takes no feature_attention_mask: model.generate raises on it as unused
    inputs = voxtral_inputs([1], seed=1)
    inputs["feature_attention_mask"] = torch.ones(1, inputs["input_features"].shape[-1], dtype=torch.long)
    with pytest.raises(ValueError, match="feature_attention_mask"):
        voxtral_model.generate(**inputs, max_new_tokens=2)
    with pytest.raises(UnsupportedError, match="feature_attention_mask is not used by Voxtral"):
        _voxtral_exported(voxtral_model, "dynamo").generate(**inputs, max_new_tokens=2)


# --- the audio LLMs whose glue follows their get_audio_features: tiny configs from the matrix's shrinking rules ---
# (family, class, real frames of row 0's clip; row 1's clip is whole)
MASKED_FAMILIES = {"audioflamingo3": "AudioFlamingo3ForConditionalGeneration",
                   "glmasr": "GlmAsrForConditionalGeneration",
                   "moss_transcribe_diarize": "MossTranscribeDiarizeForConditionalGeneration",
                   "fun_asr_nano": "FunAsrNanoForConditionalGeneration"}


def _left_padded(rows):
    """``input_ids`` and ``attention_mask`` of token rows of different lengths, left-padded with 0."""
    width = max(map(len, rows))
    return {"input_ids": torch.tensor([[0] * (width - len(s)) + s for s in rows]),
            "attention_mask": torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in rows])}


def _masked_clip_inputs(model, short, seed):
    """A left-padded batch of two clips, row 0's with only ``short`` real frames, each clip's audio tokens (as many as
    eager ``get_audio_features`` gives for that clip alone) after two text tokens, then ``3 + row`` text tokens."""
    config = model.config
    gen = torch.Generator().manual_seed(seed)
    mel = config.audio_config.num_mel_bins
    stacked = getattr(config.audio_config, "num_stacked_frames", 1)  # (FunASR-Nano: frames first, stacked bins)
    frames = 32
    mask = torch.ones(2, frames, dtype=torch.long)
    mask[0, short:] = 0
    if stacked > 1:
        features = torch.randn(2, frames, mel * stacked, generator=gen) * mask[:, :, None]
    else:
        features = torch.randn(2, mel, frames, generator=gen) * mask[:, None, :]  # the extractor pads with silence
    # (MOSS's base model names a padding_mask of raw-audio samples it does not read)
    extra = {"padding_mask": None} if "padding_mask" in inspect.signature(model.model.get_audio_features).parameters \
        else {}
    rows = []
    for r in range(2):
        with torch.no_grad():
            count = model.model.get_audio_features(input_features=features[r:r + 1], input_features_mask=mask[r:r + 1],
                                                   **extra).pooler_output.shape[0]
        text = torch.randint(3, 200, (5 + r,), generator=gen).tolist()
        rows.append(text[:2] + [config.audio_token_id] * count + text[2:])
    return {**_left_padded(rows), "input_features": features, "input_features_mask": mask}


# (GLM-ASR by default; the others in the sweep, for the suite's time: the same merge over each family's tower)
@pytest.mark.parametrize("family", [f if f == "glmasr" else pytest.param(f, marks=pytest.mark.sweep)
                                    for f in MASKED_FAMILIES])
def test_a_padded_clip_keeps_its_real_frames_like_eager(family):
    from hfexport.tools.matrix.shrink import build_model

    model = build_model(family, MASKED_FAMILIES[family])
    inputs = _masked_clip_inputs(model, short=12, seed=1)
    counts = (inputs["input_ids"] == model.config.audio_token_id).sum(-1).tolist()
    assert counts[0] < counts[1], counts  # the padded clip gives fewer features: the lengths are exercised
    exported = _exported(model, "dynamo", _masked_clip_inputs(model, short=20, seed=2))
    _assert_like_eager(model, exported, inputs, model.config.audio_token_id)


# --- audio LLMs without glue: their own get_audio_features as one part (capture.image_features.AudioFeatures) ---
ONE_PART_FAMILIES = {"nemo_speechlm": "Nemotron3_5TranscribeForConditionalGeneration",
                     "musicflamingo": "MusicFlamingoForConditionalGeneration"}


def _one_part_inputs(model, short, seed):
    """A left-padded batch of two clips of 32 frames, row 0's with ``short`` real frames (the rest silence), each
    row's audio tokens (as many as the tower makes of its real frames) after two text tokens, then ``3 + row``."""
    config = model.config
    gen = torch.Generator().manual_seed(seed)
    audio = config.audio_config
    frames_first = hasattr(audio, "asr_config")  # (Nemotron 3.5 Transcribe: [B, frames, mel], mel bins nested)
    mel = audio.asr_config.num_mel_bins if frames_first else audio.num_mel_bins
    mask = torch.ones(2, 32, dtype=torch.long)
    mask[0, short:] = 0
    if frames_first:
        features = torch.randn(2, 32, mel, generator=gen) * mask[:, :, None]
    else:
        features = torch.randn(2, mel, 32, generator=gen) * mask[:, None, :]
    _, counts = model.model.audio_tower._get_feat_extract_output_lengths(mask.sum(-1))
    rows = []
    for r, count in enumerate(counts.tolist()):
        text = torch.randint(3, 200, (5 + r,), generator=gen).tolist()
        rows.append(text[:2] + [config.audio_token_id] * count + text[2:])
    return {**_left_padded(rows), "input_features": features, "input_features_mask": mask}


@pytest.mark.parametrize("backend", ["dynamo", *(pytest.param(b, marks=pytest.mark.sweep)
                                                  for b in ("onnx", "openvino", "executorch"))])
# (both in the sweep, for the suite's time: 55-85 s each; the matrix's generate rows run them on every backend)
@pytest.mark.parametrize("family", [pytest.param(f, marks=pytest.mark.sweep) for f in ("nemo_speechlm", "musicflamingo")])
def test_an_audio_model_without_glue_generates_with_its_own_features(family, backend):
    from hfexport.capture.audio import AUDIO_GLUE
    from hfexport.tools.matrix.shrink import build_model

    assert family not in AUDIO_GLUE
    model = build_model(family, ONE_PART_FAMILIES[family])
    inputs = _one_part_inputs(model, short=16, seed=1)
    counts = (inputs["input_ids"] == model.config.audio_token_id).sum(-1).tolist()
    assert counts[0] < counts[1], counts  # the padded clip gives fewer features: the lengths are exercised
    exported = _exported(model, backend, _one_part_inputs(model, short=24, seed=2))
    assert "audio_encoder" not in exported.components
    _assert_like_eager(model, exported, inputs, model.config.audio_token_id, part="audio_features")
