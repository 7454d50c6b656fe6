"""Tiny audio-text-to-text models: ``Qwen2AudioForConditionalGeneration`` and ``VoxtralForConditionalGeneration``.

Qwen2-Audio (8 mel bins, 32 input frames): its audio tower takes exactly ``2 * max_source_positions`` frames (the
processor pads every clip to 30 s) and a ``feature_attention_mask`` saying how many are real; the tower's output
(after its average pooling) has :data:`AUDIO_TOKENS` positions, of which ``audio_output_lengths(frames)`` replace
the prompt's audio tokens.

Voxtral (8 mel bins, :data:`VOXTRAL_FRAMES` frames per clip): its Whisper-like tower encodes every clip (a row of
``input_features``, one 30 s chunk for the real processor) whole, and each :data:`VOXTRAL_CLIP_TOKENS` audio tokens
of the prompt take one clip's features (four consecutive frames stacked, projected).

Not in ``TINY_CASES`` (the architecture sweeps there have no audio prompts yet); the audio generation tests build them.
"""

from __future__ import annotations

import torch

from .tiny_multimodal import _SPECIAL_IDS, _TEXT_SIZES, TEXT_ID_END, instantiate, make_generator

__all__ = ["AUDIO_ID", "AUDIO_FRAMES", "VOXTRAL_CLIP_TOKENS", "VOXTRAL_FRAMES", "audio_output_length", "qwen2_audio",
           "qwen2_audio_inputs", "voxtral", "voxtral_inputs"]

AUDIO_ID = TEXT_ID_END + 1  # a free id below the image/video ids
AUDIO_MEL_BINS = 8
AUDIO_SOURCE_POSITIONS = 16
AUDIO_FRAMES = 2 * AUDIO_SOURCE_POSITIONS
VOXTRAL_SOURCE_POSITIONS, VOXTRAL_WIDTH, VOXTRAL_STACK = 32, 32, 4
VOXTRAL_FRAMES = 2 * VOXTRAL_SOURCE_POSITIONS  # the tower refuses any other length
VOXTRAL_CLIP_TOKENS = VOXTRAL_SOURCE_POSITIONS // VOXTRAL_STACK  # intermediate_size = VOXTRAL_STACK * width


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


def voxtral():
    """Build the tiny ``VoxtralForConditionalGeneration`` (Whisper-like tower, Llama text model; random, seeded)."""
    from transformers import LlamaConfig, VoxtralConfig, VoxtralEncoderConfig, VoxtralForConditionalGeneration

    audio = VoxtralEncoderConfig(num_mel_bins=AUDIO_MEL_BINS, num_hidden_layers=2, num_attention_heads=2,
                                 hidden_size=VOXTRAL_WIDTH, intermediate_size=VOXTRAL_STACK * VOXTRAL_WIDTH,
                                 max_source_positions=VOXTRAL_SOURCE_POSITIONS)
    text = LlamaConfig(**_TEXT_SIZES, **_SPECIAL_IDS)
    config = VoxtralConfig(audio_config=audio.to_dict(), text_config=text.to_dict(), audio_token_id=AUDIO_ID,
                           **_SPECIAL_IDS)
    return instantiate(VoxtralForConditionalGeneration, config)


def voxtral_inputs(clips: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    """A left-padded batch, row ``r`` with ``clips[r]`` clips (their audio tokens in one block after two text tokens,
    as the chat template puts a long audio's chunks), then ``3 + r`` more text tokens; ``input_features`` holds the
    clips row after row, as ``VoxtralProcessor`` stacks them."""
    gen = make_generator(len(clips), seed + 7)
    rows = []
    for r, n in enumerate(clips):
        text = torch.randint(3, 200, (5 + r,), generator=gen).tolist()
        rows.append(text[:2] + [AUDIO_ID] * (VOXTRAL_CLIP_TOKENS * n) + text[2:])
    width = max(map(len, rows))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in rows])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in rows])
    features = torch.randn(sum(clips), AUDIO_MEL_BINS, VOXTRAL_FRAMES, generator=gen)
    return {"input_ids": ids, "attention_mask": mask, "input_features": features}
