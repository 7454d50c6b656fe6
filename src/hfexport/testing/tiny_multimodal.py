"""Tiny vision, audio and image-text-to-text test models, plus shared helpers.

This module is a leaf (it imports nothing from :mod:`hfexport.testing.tiny`), so it
also hosts the helpers both modules use: the token-id convention, seeded model
instantiation and seeded text batches. :mod:`hfexport.testing.tiny` turns
:data:`MULTIMODAL_SPECS` into ``TinyCase`` entries of its ``TINY_CASES`` registry.

Token ids: ``pad=0``, ``bos=1``, ``eos=2``; ordinary text ids are drawn from
``[FIRST_REGULAR_ID, TEXT_ID_END)``; ids ``>= TEXT_ID_END`` are reserved for
multimodal placeholders (image, video, vision start/end), so they never appear
in sampled text.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    CLIPVisionConfig,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3TextConfig,
    GemmaConfig,
    GenerationConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    PaliGemmaConfig,
    PaliGemmaForConditionalGeneration,
    PreTrainedConfig,
    PreTrainedModel,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    SiglipVisionConfig,
    ViTConfig,
    ViTForImageClassification,
    WhisperConfig,
    WhisperForConditionalGeneration,
)
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig, Qwen2VLVisionConfig

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "FIRST_REGULAR_ID",
    "GEMMA3_VL_IMAGE_TOKENS",
    "IMAGE_ID",
    "LLAVA_IMAGE_TOKENS",
    "MULTIMODAL_SPECS",
    "PAD_ID",
    "PALIGEMMA_IMAGE_TOKENS",
    "QWEN2_VL_IMAGE_TOKENS",
    "TEXT_ID_END",
    "VIDEO_ID",
    "VISION_END_ID",
    "VISION_START_ID",
    "VOCAB",
    "WHISPER_FRAMES",
    "WHISPER_MEL_BINS",
    "instantiate",
    "make_generator",
    "text_batch",
]

VOCAB = 256
PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
FIRST_REGULAR_ID = 3
TEXT_ID_END = 248
IMAGE_ID, VIDEO_ID, VISION_START_ID, VISION_END_ID = 250, 251, 252, 253
WHISPER_DECODER_START_ID = 3
WHISPER_MEL_BINS = 8
WHISPER_SOURCE_POSITIONS = 16
WHISPER_FRAMES = 2 * WHISPER_SOURCE_POSITIONS
VIT_IMAGE, VIT_PATCH, VIT_LABELS = 32, 8, 4
QWEN2_VL_PATCH, QWEN2_VL_TEMPORAL, QWEN2_VL_MERGE = 4, 2, 2
QWEN2_VL_GRID = (1, 4, 4)  # (t, h, w) in patches, per image
QWEN2_VL_IMAGE_TOKENS = QWEN2_VL_GRID[0] * QWEN2_VL_GRID[1] * QWEN2_VL_GRID[2] // QWEN2_VL_MERGE**2
LLAVA_IMAGE, LLAVA_PATCH = 16, 4
LLAVA_IMAGE_TOKENS = (LLAVA_IMAGE // LLAVA_PATCH) ** 2
SIGLIP_IMAGE, SIGLIP_PATCH = 16, 4
PALIGEMMA_IMAGE_TOKENS = (SIGLIP_IMAGE // SIGLIP_PATCH) ** 2
GEMMA3_VL_IMAGE_TOKENS = 16  # the 4 x 4 patches, average-pooled 1 x 1
GEMMA3_VL_SLIDING_WINDOW = 8

_SPECIAL_IDS = {"pad_token_id": PAD_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID}
# the language model of every image-text case: 2 layers, hidden 64, 4 query / 2 key-value heads
_TEXT_SIZES = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def instantiate(
    cls: type[PreTrainedModel],
    config: PreTrainedConfig,
    generation: bool = True,
    decoder_start_token_id: int | None = None,
) -> PreTrainedModel:
    """Instantiate ``cls`` from ``config`` with seeded random weights.

    Seeds with ``torch.manual_seed(0)`` inside :func:`torch.random.fork_rng`, so the
    result is deterministic and the caller's RNG state is left untouched.

    Args:
        cls: The transformers model class.
        config: Its config.
        generation: Attach a greedy :class:`GenerationConfig` (pad/bos/eos set,
            ``do_sample=False``) when the model can generate.
        decoder_start_token_id: Decoder start token for encoder-decoder models.

    Returns:
        The model in ``eval()`` mode, float32, with ``sdpa`` attention where
        supported and ``eager`` otherwise.
    """
    attn = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = cls._from_config(config, attn_implementation=attn, dtype=torch.float32)
    model.eval()
    if generation and model.can_generate():
        extra = {} if decoder_start_token_id is None else {"decoder_start_token_id": decoder_start_token_id}
        model.generation_config = GenerationConfig(do_sample=False, **_SPECIAL_IDS, **extra)
    return model


def make_generator(batch: int, seq: int) -> torch.Generator:
    """Return a CPU generator seeded deterministically from ``(batch, seq)``."""
    return torch.Generator().manual_seed(1_000 * batch + seq)


def text_batch(gen: torch.Generator, batch: int, seq: int, padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample text ``input_ids`` and ``attention_mask`` of shape ``[batch, seq]``.

    Args:
        gen: Seeded generator.
        batch: Batch size.
        seq: Sequence length.
        padded: When true and ``batch >= 2``, row 0 is left-padded by two positions
            (``min(2, seq - 1)``, so it keeps at least one real token).

    Returns:
        ``(input_ids, attention_mask)``, int64; pad positions hold ``PAD_ID``.
    """
    input_ids = torch.randint(FIRST_REGULAR_ID, TEXT_ID_END, (batch, seq), generator=gen)
    attention_mask = torch.ones(batch, seq, dtype=torch.long)
    if padded and batch >= 2:
        n_pad = min(2, seq - 1)
        input_ids[0, :n_pad] = PAD_ID
        attention_mask[0, :n_pad] = 0
    return input_ids, attention_mask


def _insert_after_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, block: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Insert ``block`` into every row right after its left padding.

    Returns:
        ``(input_ids, attention_mask)`` of shape ``[batch, seq + len(block)]``.
    """
    ids_rows, mask_rows = [], []
    block_ids = torch.tensor(block, dtype=torch.long)
    for ids, mask in zip(input_ids, attention_mask, strict=True):
        n_pad = int((mask == 0).sum())
        ids_rows.append(torch.cat([ids[:n_pad], block_ids, ids[n_pad:]]))
        mask_rows.append(torch.cat([mask[:n_pad], torch.ones(len(block), dtype=torch.long), mask[n_pad:]]))
    return torch.stack(ids_rows), torch.stack(mask_rows)


def _vit() -> PreTrainedModel:
    """Build the tiny ``ViTForImageClassification`` (32x32 images, 8x8 patches, 4 labels)."""
    config = ViTConfig(
        image_size=VIT_IMAGE,
        patch_size=VIT_PATCH,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=VIT_LABELS,
    )
    return instantiate(ViTForImageClassification, config, generation=False)


def _vit_inputs(batch: int, seq: int, padded: bool = True) -> dict[str, torch.Tensor]:
    """Return ``pixel_values`` ``[batch, 3, 32, 32]``; ``seq`` and ``padded`` are ignored."""
    gen = make_generator(batch, seq)
    return {"pixel_values": torch.randn(batch, 3, VIT_IMAGE, VIT_IMAGE, generator=gen)}


def _whisper() -> PreTrainedModel:
    """Build the tiny ``WhisperForConditionalGeneration`` (8 mel bins, 32 input frames).

    ``init_std=0.2`` and untied output embeddings make greedy tokens depend on the
    audio; with the default 0.02 every row decodes to the same tokens.
    """
    config = WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=WHISPER_MEL_BINS,
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_source_positions=WHISPER_SOURCE_POSITIONS,
        max_target_positions=64,
        decoder_start_token_id=WHISPER_DECODER_START_ID,
        suppress_tokens=None,
        begin_suppress_tokens=None,
        init_std=0.2,
        tie_word_embeddings=False,
        **_SPECIAL_IDS,
    )
    return instantiate(WhisperForConditionalGeneration, config, decoder_start_token_id=WHISPER_DECODER_START_ID)


def _whisper_inputs(batch: int, seq: int, padded: bool = True) -> dict[str, torch.Tensor]:
    """Return Whisper inputs.

    Args:
        batch: Batch size.
        seq: Decoder length; ``decoder_input_ids[:, 0]`` is the decoder start token.
        padded: Ignored (audio features are never padded here).

    Returns:
        ``input_features`` ``[batch, 8, 32]`` and ``decoder_input_ids`` ``[batch, seq]``.
    """
    gen = make_generator(batch, seq)
    features = torch.randn(batch, WHISPER_MEL_BINS, WHISPER_FRAMES, generator=gen)
    decoder_input_ids = torch.randint(FIRST_REGULAR_ID, TEXT_ID_END, (batch, seq), generator=gen)
    decoder_input_ids[:, 0] = WHISPER_DECODER_START_ID
    return {"input_features": features, "decoder_input_ids": decoder_input_ids}


def _qwen2_vl() -> PreTrainedModel:
    """Build the tiny ``Qwen2VLForConditionalGeneration`` (M-RoPE, 4 tokens per image)."""
    text = Qwen2VLTextConfig(
        **_TEXT_SIZES,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        **_SPECIAL_IDS,
    )
    vision = Qwen2VLVisionConfig(
        depth=2,
        embed_dim=32,
        hidden_size=64,
        mlp_ratio=2,
        num_heads=2,
        in_channels=3,
        patch_size=QWEN2_VL_PATCH,
        temporal_patch_size=QWEN2_VL_TEMPORAL,
        spatial_merge_size=QWEN2_VL_MERGE,
    )
    config = Qwen2VLConfig(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        image_token_id=IMAGE_ID,
        video_token_id=VIDEO_ID,
        vision_start_token_id=VISION_START_ID,
        vision_end_token_id=VISION_END_ID,
        tie_word_embeddings=False,
        **_SPECIAL_IDS,
    )
    return instantiate(Qwen2VLForConditionalGeneration, config)


def _qwen2_vl_inputs(batch: int, seq: int, padded: bool = True) -> dict[str, torch.Tensor]:
    """Return Qwen2-VL inputs: one 16x16 image per row followed by ``seq`` text tokens.

    Each row is ``[pads] <vision_start> <image> x 4 <vision_end> [text]``, so the
    sequence length is ``seq + QWEN2_VL_IMAGE_TOKENS + 2``.

    Args:
        batch: Batch size (one image per row).
        seq: Number of text positions (including left padding of row 0).
        padded: Left-pad row 0 by two positions when ``batch >= 2``.

    Returns:
        ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` (1 at image tokens),
        ``pixel_values`` ``[batch * 16, 96]`` (flattened patches) and
        ``image_grid_thw`` ``[batch, 3]``.
    """
    gen = make_generator(batch, seq)
    input_ids, attention_mask = text_batch(gen, batch, seq, padded)
    block = [VISION_START_ID] + [IMAGE_ID] * QWEN2_VL_IMAGE_TOKENS + [VISION_END_ID]
    input_ids, attention_mask = _insert_after_padding(input_ids, attention_mask, block)
    t, h, w = QWEN2_VL_GRID
    patch_dim = 3 * QWEN2_VL_TEMPORAL * QWEN2_VL_PATCH * QWEN2_VL_PATCH
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "mm_token_type_ids": (input_ids == IMAGE_ID).long(),
        "pixel_values": torch.randn(batch * t * h * w, patch_dim, generator=gen),
        "image_grid_thw": torch.tensor([list(QWEN2_VL_GRID)] * batch, dtype=torch.long),
    }


def _llava() -> PreTrainedModel:
    """Build the tiny ``LlavaForConditionalGeneration`` (CLIP 16x16 vision tower + Llama)."""
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        projection_dim=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=LLAVA_IMAGE,
        patch_size=LLAVA_PATCH,
    )
    text = LlamaConfig(
        **_TEXT_SIZES,
        **_SPECIAL_IDS,
    )
    config = LlavaConfig(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_index=IMAGE_ID,
        image_seq_length=LLAVA_IMAGE_TOKENS,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        **_SPECIAL_IDS,
    )
    return instantiate(LlavaForConditionalGeneration, config)


def _llava_inputs(batch: int, seq: int, padded: bool = True) -> dict[str, torch.Tensor]:
    """Return LLaVA inputs: ``[pads] <image> x 16 [text]`` per row plus ``pixel_values``.

    Args:
        batch: Batch size (one 16x16 image per row).
        seq: Number of text positions (including left padding of row 0).
        padded: Left-pad row 0 by two positions when ``batch >= 2``.

    Returns:
        ``input_ids`` / ``attention_mask`` of length ``seq + LLAVA_IMAGE_TOKENS`` and
        ``pixel_values`` ``[batch, 3, 16, 16]``.
    """
    gen = make_generator(batch, seq)
    input_ids, attention_mask = text_batch(gen, batch, seq, padded)
    input_ids, attention_mask = _insert_after_padding(input_ids, attention_mask, [IMAGE_ID] * LLAVA_IMAGE_TOKENS)
    pixel_values = torch.randn(batch, 3, LLAVA_IMAGE, LLAVA_IMAGE, generator=gen)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "pixel_values": pixel_values}


def _siglip() -> dict[str, Any]:
    """The tiny SigLIP vision config of PaliGemma and Gemma3: 16x16 images in 4x4 patches."""
    return SiglipVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=SIGLIP_IMAGE,
        patch_size=SIGLIP_PATCH,
        vision_use_head=False,  # as in the released checkpoints: both read the last hidden state, not the pooled head
    ).to_dict()


def _paligemma() -> PreTrainedModel:
    """Build the tiny ``PaliGemmaForConditionalGeneration`` (SigLIP 16x16 vision tower + Gemma, 16 tokens per image).

    Its prompt prefix (image and text, ``token_type_ids == 0``) attends bidirectionally; generated tokens causally.
    ``initializer_range=0.1`` and untied output embeddings make greedy tokens depend on that mask (with the
    defaults, a causal prompt decodes to the same tokens).
    """
    text = GemmaConfig(
        **_TEXT_SIZES,
        head_dim=16,
        initializer_range=0.1,
        **_SPECIAL_IDS,
    )
    config = PaliGemmaConfig(
        vision_config=_siglip(),
        text_config=text.to_dict(),
        image_token_index=IMAGE_ID,
        vocab_size=VOCAB,
        projection_dim=64,
        hidden_size=64,
        tie_word_embeddings=False,
        **_SPECIAL_IDS,
    )
    return instantiate(PaliGemmaForConditionalGeneration, config)


def _paligemma_inputs(batch: int, seq: int, padded: bool = True) -> dict[str, torch.Tensor]:
    """Return PaliGemma inputs: ``[pads] <image> x 16 [text]`` per row, ``token_type_ids`` and ``pixel_values``.

    ``token_type_ids`` is 0 over the whole prompt, as the processor returns it for generation (the prefix; 1 marks
    a training suffix), so every prompt token attends to every other.

    Returns:
        ``input_ids`` / ``attention_mask`` / ``token_type_ids`` of length ``seq + PALIGEMMA_IMAGE_TOKENS`` and
        ``pixel_values`` ``[batch, 3, 16, 16]``.
    """
    gen = make_generator(batch, seq)
    input_ids, attention_mask = text_batch(gen, batch, seq, padded)
    input_ids, attention_mask = _insert_after_padding(input_ids, attention_mask, [IMAGE_ID] * PALIGEMMA_IMAGE_TOKENS)
    pixel_values = torch.randn(batch, 3, SIGLIP_IMAGE, SIGLIP_IMAGE, generator=gen)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": torch.zeros_like(input_ids),
            "pixel_values": pixel_values}


def _gemma3_vl() -> PreTrainedModel:
    """Build the tiny ``Gemma3ForConditionalGeneration`` (SigLIP 16x16 tower, 16 tokens per image, a sliding window
    of 8 on layer 0).

    The image tokens of one image (``token_type_ids == 1``) attend to each other bidirectionally, within the window
    in the sliding layer. Sixteen image tokens (no pooling) and untied output embeddings make greedy tokens depend
    on that mask (with 4 pooled tokens, a causal image block decodes to the same tokens).
    """
    text = Gemma3TextConfig(
        **_TEXT_SIZES,
        head_dim=16,
        query_pre_attn_scalar=16,
        sliding_window=GEMMA3_VL_SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        **_SPECIAL_IDS,
    )
    config = Gemma3Config(
        text_config=text.to_dict(),
        vision_config=_siglip(),
        mm_tokens_per_image=GEMMA3_VL_IMAGE_TOKENS,
        boi_token_index=VISION_START_ID,
        eoi_token_index=VISION_END_ID,
        image_token_index=IMAGE_ID,
        tie_word_embeddings=False,
        **_SPECIAL_IDS,
    )
    return instantiate(Gemma3ForConditionalGeneration, config)


def _gemma3_vl_inputs(batch: int, seq: int, padded: bool = True) -> dict[str, torch.Tensor]:
    """Return Gemma3 inputs: ``[pads] <start_of_image> <image> x 16 <end_of_image> [text]`` per row.

    Returns:
        ``input_ids``, ``attention_mask``, ``token_type_ids`` (1 at image tokens, as the processor returns it) of
        length ``seq + GEMMA3_VL_IMAGE_TOKENS + 2`` and ``pixel_values`` ``[batch, 3, 16, 16]``.
    """
    gen = make_generator(batch, seq)
    input_ids, attention_mask = text_batch(gen, batch, seq, padded)
    block = [VISION_START_ID] + [IMAGE_ID] * GEMMA3_VL_IMAGE_TOKENS + [VISION_END_ID]
    input_ids, attention_mask = _insert_after_padding(input_ids, attention_mask, block)
    pixel_values = torch.randn(batch, 3, SIGLIP_IMAGE, SIGLIP_IMAGE, generator=gen)
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "token_type_ids": (input_ids == IMAGE_ID).long(), "pixel_values": pixel_values}


_SPEC_KEYS = ("name", "family", "build", "inputs", "generative", "auto_class")
_ITT = ("image-text-to-text", True, "AutoModelForImageTextToText")

#: ``TinyCase`` keyword arguments for the cases defined here.
MULTIMODAL_SPECS: list[dict[str, Any]] = [
    dict(zip(_SPEC_KEYS, row))
    for row in (
        ("vit", "vision", _vit, _vit_inputs, False, "AutoModelForImageClassification"),
        ("whisper", "audio", _whisper, _whisper_inputs, True, "AutoModelForSpeechSeq2Seq"),
        ("qwen2_vl", _ITT[0], _qwen2_vl, _qwen2_vl_inputs, *_ITT[1:]),
        ("llava", _ITT[0], _llava, _llava_inputs, *_ITT[1:]),
        ("paligemma", _ITT[0], _paligemma, _paligemma_inputs, *_ITT[1:]),
        ("gemma3_vl", _ITT[0], _gemma3_vl, _gemma3_vl_inputs, *_ITT[1:]),
    )
]
