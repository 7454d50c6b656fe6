"""Audio prompts of audio-text-to-text exports: the audio tower's features over the prompt's audio tokens.

Shared by capture (which uses the model's own ``get_audio_features`` as one part for a model type without an entry
here: :mod:`.image_features`) and generation (which runs the glue on the exported parts), as :mod:`.video` is.

Each model type's glue is what its forward does around the tower (:data:`AUDIO_GLUE`), transformers 5.x:

- Qwen2-Audio (``Qwen2AudioModel.forward``): the tower takes the padded log-mel features and a bidirectional mask
  over its convolution's output frames (the real ones from ``feature_attention_mask``), the projector maps its
  pooled output to the text width, each clip keeps its first ``audio_output_lengths`` positions, and those are
  scattered over the audio tokens.
- Voxtral (``VoxtralModel.get_audio_features``): every clip (a 30 s chunk: the processor splits longer audio into
  rows of ``input_features``) is encoded whole, with no mask; the tower's output is regrouped into rows of the audio
  config's ``intermediate_size`` (consecutive frames stacked), projected, and all of them, clip after clip, are
  scattered over the audio tokens.
- Audio Flamingo 3 (``AudioFlamingo3Model.get_audio_features``): the tower takes the features and their
  ``input_features_mask`` (it builds its own attention mask from it), the projector maps every frame, and each clip
  keeps as many as Qwen2-Audio's formula gives for its real frames (its ``_get_feat_extract_output_lengths``).
- GLM-ASR (``GlmAsrModel.get_audio_features``): the tower takes the features alone; its frames are regrouped into
  rows of the audio config's ``intermediate_size`` per clip, projected, and each clip keeps the positions its real
  frames make through the two convolutions (kernel 3, strides 1 and 2) and the merge of 4.
- MOSS Transcribe Diarize (``MossTranscribeDiarizeModel.get_audio_features``): the tower takes the features alone;
  each chunk keeps its real frames after the stride-2 convolution, rounded up to whole merges of
  ``audio_merge_size`` frames; those are concatenated in groups of ``audio_merge_size`` and projected.
- FunASR-Nano (``FunAsrNanoModel.get_audio_features``): the tower and the projector both take the features'
  ``input_features_mask``; the projected frames the mask keeps, clip after clip, go to the audio tokens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .glue import glue_for, merge_image_features
from ..errors import UnsupportedError

__all__ = ["AUDIO_GLUE", "merge_audio"]


def _pooled_lengths(frames: torch.Tensor) -> torch.Tensor:
    """Positions a Whisper-like tower with a stride-2 convolution and a pooling by 2 makes of ``frames`` real frames
    (``_get_feat_extract_output_lengths`` of Qwen2-Audio's and Audio Flamingo 3's towers)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def _real_frames(inputs: dict, features: torch.Tensor) -> torch.Tensor:
    """Each clip's real input frames: the sum of its ``input_features_mask`` row, the whole clip without one."""
    mask = inputs.get("input_features_mask")
    if mask is None:
        return torch.full((features.shape[0],), features.shape[-1], device=features.device)
    return mask.sum(-1).to(torch.long)


def _hidden(output: Any) -> torch.Tensor:
    return output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]


def _first(features: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """The first ``lengths[i]`` positions of each clip ``features[i]``, clip after clip: ``[sum(lengths), width]``."""
    keep = torch.arange(features.shape[1], device=features.device)[None, :] < lengths.to(features.device)[:, None]
    return features[keep]


def _qwen2_audio(config: Any, encoder: Any, project: Callable | None, input_ids: torch.Tensor,
                 embeds: torch.Tensor, inputs: dict) -> torch.Tensor:
    features = inputs["input_features"]
    batch, _, frames = features.shape
    real = inputs.get("feature_attention_mask")
    lengths = real.sum(-1) if real is not None else torch.full((batch,), frames, device=features.device)
    conv = (lengths - 1) // 2 + 1
    out_lengths = _pooled_lengths(lengths)
    width = (frames - 2) // 2 + 1
    valid = torch.arange(width, device=features.device)[None, :] < conv[:, None]
    call = {"input_features": features}
    if encoder.mask_kind() == "4d":
        call["attention_mask"] = valid[:, None, None, :].expand(batch, 1, width, width)
    elif not bool(valid.all()):
        raise UnsupportedError(
            "this audio clip is shorter than the audio tower's window (feature_attention_mask holds zeros), but the "
            "exported tower takes no attention mask: its sample clip had none. Re-export with a sample whose "
            "feature_attention_mask pads a clip, or pass full-length clips"
        )
    hidden = _hidden(encoder.runner(**call))
    projected = project(hidden) if project is not None else hidden
    return merge_image_features(input_ids, embeds, _first(projected, out_lengths), int(config.audio_token_id), "audio")


def _voxtral(config: Any, encoder: Any, project: Callable | None, input_ids: torch.Tensor, embeds: torch.Tensor,
             inputs: dict) -> torch.Tensor:
    for key in ("feature_attention_mask", "input_features_mask"):
        if inputs.get(key) is not None:
            # VoxtralForConditionalGeneration.forward takes no audio mask: model.generate refuses it as unused
            raise UnsupportedError(
                f"{key} is not used by Voxtral (its tower encodes each 30 s chunk whole; the processor pads with "
                "silence): drop it"
            )
    hidden = _hidden(encoder.runner(input_features=inputs["input_features"]))
    grouped = hidden.reshape(-1, config.audio_config.intermediate_size)
    projected = project(grouped) if project is not None else grouped
    return merge_image_features(input_ids, embeds, projected, int(config.audio_token_id), "audio")


def _audioflamingo3(config: Any, encoder: Any, project: Callable | None, input_ids: torch.Tensor,
                    embeds: torch.Tensor, inputs: dict) -> torch.Tensor:
    features = inputs["input_features"]
    frames = _real_frames(inputs, features)
    call = {"input_features": features}
    if encoder.feeds("input_features_mask"):  # (the tower masks its attention from it)
        mask = inputs.get("input_features_mask")
        batch, _, length = features.shape
        call["input_features_mask"] = mask if mask is not None else torch.ones(batch, length, dtype=torch.long)
    hidden = _hidden(encoder.runner(**call))
    projected = project(hidden) if project is not None else hidden
    return merge_image_features(input_ids, embeds, _first(projected, _pooled_lengths(frames)),
                                int(config.audio_token_id), "audio")


def _glmasr(config: Any, encoder: Any, project: Callable | None, input_ids: torch.Tensor, embeds: torch.Tensor,
            inputs: dict) -> torch.Tensor:
    features = inputs["input_features"]
    lengths = _real_frames(inputs, features)
    hidden = _hidden(encoder.runner(input_features=features))
    grouped = hidden.reshape(features.shape[0], -1, config.audio_config.intermediate_size)
    projected = project(grouped) if project is not None else grouped
    for padding, kernel, stride in ((1, 3, 1), (1, 3, 2)):
        lengths = (lengths + 2 * padding - (kernel - 1) - 1) // stride + 1
    lengths = (lengths - 4) // 4 + 1
    return merge_image_features(input_ids, embeds, _first(projected, lengths), int(config.audio_token_id), "audio")


def _moss_transcribe_diarize(config: Any, encoder: Any, project: Callable | None, input_ids: torch.Tensor,
                             embeds: torch.Tensor, inputs: dict) -> torch.Tensor:
    features = inputs["input_features"]
    merge = int(config.audio_merge_size)
    conv = (_real_frames(inputs, features) - 1) // 2 + 1
    hidden = _hidden(encoder.runner(input_features=features))
    kept = _first(hidden, (conv + merge - 1) // merge * merge)
    grouped = kept.reshape(-1, merge * kept.shape[-1])
    projected = project(grouped) if project is not None else grouped
    return merge_image_features(input_ids, embeds, projected, int(config.audio_token_id), "audio")


def _fun_asr_nano(config: Any, encoder: Any, project: Callable | None, input_ids: torch.Tensor,
                  embeds: torch.Tensor, inputs: dict) -> torch.Tensor:
    mask = inputs.get("input_features_mask")
    if mask is None:  # (its get_audio_features requires it: model.generate fails without it too)
        raise UnsupportedError("FunASR-Nano's audio tower and projector take input_features_mask: pass the "
                               "processor's mask with input_features")
    hidden = _hidden(encoder.runner(input_features=inputs["input_features"], input_features_mask=mask))
    projected = project(hidden) if project is not None else hidden  # (the projector takes the mask from inputs)
    return merge_image_features(input_ids, embeds, projected[mask.to(torch.bool)], int(config.audio_token_id),
                                "audio")


#: model_type -> ``fn(config, encoder component, projector or None, input_ids, embeds, inputs)`` -> merged embeds
AUDIO_GLUE: dict[str, Callable[..., torch.Tensor]] = {
    "qwen2_audio": _qwen2_audio, "voxtral": _voxtral, "audioflamingo3": _audioflamingo3, "glmasr": _glmasr,
    "moss_transcribe_diarize": _moss_transcribe_diarize, "fun_asr_nano": _fun_asr_nano,
}


def merge_audio(config: Any, encoder: Any, project: Callable | None, input_ids: torch.Tensor, embeds: torch.Tensor,
                inputs: dict) -> torch.Tensor:
    """The prompt's embeddings with the audio features merged in (unchanged for a prompt without audio)."""
    if inputs.get("input_features") is None:
        return embeds
    glue = glue_for(AUDIO_GLUE, config, "audio features", "audio prompts", "generate with the eager model")
    return glue(config, encoder, project, input_ids, embeds, inputs)
