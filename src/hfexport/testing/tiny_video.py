"""A tiny video-text-to-text model: ``LlavaNextVideoForConditionalGeneration`` (CLIP 16x16 frames + Llama).

Each frame goes through the vision tower as an image (16 patches of 4x4 pixels, CLS dropped), is average-pooled
with stride 2 to :data:`LLAVA_NEXT_VIDEO_FRAME_TOKENS` tokens and projected; a video of ``f`` frames fills
``f * LLAVA_NEXT_VIDEO_FRAME_TOKENS`` video tokens of the prompt. Not in ``TINY_CASES`` (the architecture sweeps
there have no video prompts); the video generation tests build it.
"""

from __future__ import annotations

import torch

from .tiny_multimodal import _SPECIAL_IDS, _TEXT_SIZES, IMAGE_ID, VIDEO_ID, instantiate, make_generator

__all__ = ["LLAVA_NEXT_VIDEO_FRAME", "LLAVA_NEXT_VIDEO_FRAME_TOKENS", "llava_next_video", "llava_next_video_inputs"]

LLAVA_NEXT_VIDEO_FRAME, LLAVA_NEXT_VIDEO_PATCH, LLAVA_NEXT_VIDEO_POOL = 16, 4, 2
LLAVA_NEXT_VIDEO_FRAME_TOKENS = (LLAVA_NEXT_VIDEO_FRAME // LLAVA_NEXT_VIDEO_PATCH // LLAVA_NEXT_VIDEO_POOL) ** 2


def llava_next_video():
    """Build the tiny ``LlavaNextVideoForConditionalGeneration`` (random weights, seeded): the second-to-last hidden
    state of the tower, CLS dropped, average pooling, as the released checkpoints are configured."""
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaNextVideoConfig, LlavaNextVideoForConditionalGeneration

    size = LLAVA_NEXT_VIDEO_FRAME
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, projection_dim=32, num_hidden_layers=2,
                              num_attention_heads=2, image_size=size, patch_size=LLAVA_NEXT_VIDEO_PATCH)
    text = LlamaConfig(**_TEXT_SIZES, **_SPECIAL_IDS)
    config = LlavaNextVideoConfig(
        vision_config=vision.to_dict(),
        text_config=text.to_dict(),
        image_token_index=IMAGE_ID,
        video_token_index=VIDEO_ID,
        image_grid_pinpoints=[[size, 2 * size], [2 * size, size], [2 * size, 2 * size]],
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        spatial_pool_mode="average",
        spatial_pool_stride=LLAVA_NEXT_VIDEO_POOL,
        **_SPECIAL_IDS,
    )
    return instantiate(LlavaNextVideoForConditionalGeneration, config)


def llava_next_video_inputs(rows: int, frames: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """``rows`` prompts, left-padded, each with one video of ``frames`` frames after two text tokens and ``3 + r``
    more text tokens after it (row ``r``); ``pixel_values_videos`` ``[rows, frames, 3, 16, 16]``."""
    gen = make_generator(rows, 100 * frames + seed)
    seqs = []
    for r in range(rows):
        text = torch.randint(3, 200, (5 + r,), generator=gen).tolist()
        seqs.append(text[:2] + [VIDEO_ID] * (frames * LLAVA_NEXT_VIDEO_FRAME_TOKENS) + text[2:])
    width = max(map(len, seqs))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    size = LLAVA_NEXT_VIDEO_FRAME
    videos = torch.randn(rows, frames, 3, size, size, generator=gen)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values_videos": videos}
