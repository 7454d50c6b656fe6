"""A tiny audio-text-to-text model: ``Qwen2AudioForConditionalGeneration`` (8 mel bins, 32 input frames).

Its audio tower takes exactly ``2 * max_source_positions`` frames (the processor pads every clip to 30 s) and a
``feature_attention_mask`` saying how many are real; the tower's output (after its average pooling) has
:data:`AUDIO_TOKENS` positions, of which ``audio_output_lengths(frames)`` replace the prompt's audio tokens.
Not in ``TINY_CASES`` (the architecture sweeps there have no audio prompts yet); the audio generation tests build it.
"""

from __future__ import annotations

import torch

from .tiny_multimodal import _SPECIAL_IDS, _TEXT_SIZES, TEXT_ID_END, instantiate, make_generator

__all__ = ["AUDIO_ID", "AUDIO_FRAMES", "qwen2_audio", "qwen2_audio_inputs", "audio_output_length"]

AUDIO_ID = TEXT_ID_END + 1  # a free id below the image/video ids
AUDIO_MEL_BINS = 8
AUDIO_SOURCE_POSITIONS = 16
AUDIO_FRAMES = 2 * AUDIO_SOURCE_POSITIONS


def audio_output_length(frames: int) -> int:
    """Audio tokens a clip of ``frames`` real frames gives (``Qwen2AudioEncoder._get_feat_extract_output_lengths``)."""
    return ((frames - 1) // 2 + 1 - 2) // 2 + 1


def qwen2_audio():
    """Build the tiny ``Qwen2AudioForConditionalGeneration`` (random weights, seeded)."""
    from transformers import Qwen2AudioConfig, Qwen2AudioEncoderConfig, Qwen2AudioForConditionalGeneration, Qwen2Config

    audio = Qwen2AudioEncoderConfig(num_mel_bins=AUDIO_MEL_BINS, encoder_layers=2, encoder_attention_heads=2,
                                    encoder_ffn_dim=64, d_model=32, max_source_positions=AUDIO_SOURCE_POSITIONS)
    text = Qwen2Config(**_TEXT_SIZES, **_SPECIAL_IDS)
    config = Qwen2AudioConfig(audio_config=audio.to_dict(), text_config=text.to_dict(), audio_token_id=AUDIO_ID,
                              **_SPECIAL_IDS)
    return instantiate(Qwen2AudioForConditionalGeneration, config)


def qwen2_audio_inputs(frames: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """A left-padded batch, one clip per row with ``frames[row]`` real frames, its audio tokens after two text
    tokens, then three more text tokens per row (row ``r`` has ``r`` extra)."""
    gen = make_generator(len(frames), seed + 5)
    rows = []
    for r, n in enumerate(frames):
        text = torch.randint(3, 200, (5 + r,), generator=gen).tolist()
        rows.append(text[:2] + [AUDIO_ID] * audio_output_length(n) + text[2:])
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in rows])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in rows])
    features = torch.randn(len(frames), AUDIO_MEL_BINS, AUDIO_FRAMES, generator=gen)
    feature_mask = torch.tensor([[1] * n + [0] * (AUDIO_FRAMES - n) for n in frames])
    features = features * feature_mask[:, None, :]  # the processor's padding is silence
    return {"input_ids": ids, "attention_mask": mask, "input_features": features,
            "feature_attention_mask": feature_mask}
