"""Audio-text-to-text prompts through ``ExportedModel.generate``: a tiny Qwen2-Audio, its audio tower, projector and
language model exported as parts, the audio features merged over the prompt's audio tokens as the model's forward
merges them (padded clips masked in the tower, each clip's real frames kept), token for token against eager
``model.generate``. Each prompt is first checked to change eager's tokens against the same text without the audio.
"""

from __future__ import annotations

import pytest
import torch

from generation_cases import exporter_for
from hfexport.testing.tiny_audio import AUDIO_ID, qwen2_audio, qwen2_audio_inputs

NEW = 10
# real frames per clip: one full clip; a left-padded batch of a short and a full clip; two short clips
PROMPTS = {"full-clip": [32], "short-and-full": [24, 32], "two-short": [12, 28]}


@pytest.fixture(scope="module")
def model():
    return qwen2_audio()


_EXPORTS: dict = {}


def _exported(model, backend):
    if backend not in _EXPORTS:
        exporter, config = exporter_for(backend)
        # a padded clip in the sample: the tower is traced with its mask
        _EXPORTS[backend] = exporter.export_for_generation(model, qwen2_audio_inputs([20, 32]), config)
    return _EXPORTS[backend]


@pytest.mark.parametrize("backend", ["dynamo", pytest.param("onnx", marks=pytest.mark.sweep)])
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_audio_prompt_generates_like_eager(model, backend, prompt):
    inputs = qwen2_audio_inputs(PROMPTS[prompt], seed=1)
    start = inputs["input_ids"].shape[1]
    with torch.no_grad():
        want = model.generate(**inputs, max_new_tokens=NEW, do_sample=False)
        plain = model.generate(input_ids=inputs["input_ids"].masked_fill(inputs["input_ids"] == AUDIO_ID, 5),
                               attention_mask=inputs["attention_mask"], max_new_tokens=NEW, do_sample=False)
    assert not torch.equal(want[:, start:], plain[:, start:]), "the audio does not change eager's tokens"
    exported = _exported(model, backend)
    assert "audio_encoder" in exported.components
    got = exported.generate(**inputs, max_new_tokens=NEW)
    assert torch.equal(got, want), (got[:, start:], want[:, start:])
