"""Video prompts through ``ExportedModel.generate``: the video frames go through the exported vision tower with each
model's own ``get_video_features`` glue and are scattered over the video tokens; token for token against eager
``model.generate``, each prompt first checked to change eager's tokens against the same text without the video.

- Qwen2-VL (M-RoPE positions from the video's grid): a video alone, an image and a video in one prompt, a
  left-padded batch of 2; the export was traced on the tiny case's image prompts only.
- LLaVA-NeXT-Video (every frame through the CLIP tower, average-pooled, projected): a video alone, a left-padded
  batch of 2, both with more frames than the export's sample; its any-resolution images are refused by name.

A model whose videos are not merged is refused by name.
"""

from __future__ import annotations

import pytest
import torch

from generation_cases import exporter_for
from hfexport import DynamoConfig, UnsupportedError
from hfexport.exporter_dynamo import DynamoExporter
from hfexport.testing.tiny import TINY_CASES
from hfexport.testing.tiny_video import llava_next_video, llava_next_video_inputs
from hfexport.testing.tiny_multimodal import (
    IMAGE_ID,
    QWEN2_VL_GRID,
    QWEN2_VL_MERGE,
    QWEN2_VL_PATCH,
    QWEN2_VL_TEMPORAL,
    VIDEO_ID,
    VISION_END_ID,
    VISION_START_ID,
)

NEW = 12
PATCH_DIM = 3 * QWEN2_VL_TEMPORAL * QWEN2_VL_PATCH ** 2
VIDEO_GRID = (2, 4, 4)  # two temporal patches (four frames) of 4x4 patches


def _tokens(grid):
    t, h, w = grid
    return t * h * w // QWEN2_VL_MERGE ** 2


def _prompt(rows, with_image=False, seed=0):
    """``rows`` prompts of text around one video (and an image first, with ``with_image``), left-padded."""
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for r in range(rows):
        text = torch.randint(3, 200, (3 + 2 * r,), generator=gen).tolist()
        block = [VISION_START_ID] + [VIDEO_ID] * _tokens(VIDEO_GRID) + [VISION_END_ID]
        if with_image:
            block = [VISION_START_ID] + [IMAGE_ID] * _tokens(QWEN2_VL_GRID) + [VISION_END_ID] + block
        seqs.append(text[:2] + block + text[2:])
    width = max(map(len, seqs))
    ids = torch.tensor([[0] * (width - len(s)) + s for s in seqs])
    mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    types = (ids == IMAGE_ID).long() + 2 * (ids == VIDEO_ID).long()
    n = VIDEO_GRID[0] * VIDEO_GRID[1] * VIDEO_GRID[2]
    out = {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": types,
           "pixel_values_videos": torch.randn(rows * n, PATCH_DIM, generator=gen),
           "video_grid_thw": torch.tensor([list(VIDEO_GRID)] * rows)}
    if with_image:
        m = QWEN2_VL_GRID[0] * QWEN2_VL_GRID[1] * QWEN2_VL_GRID[2]
        out["pixel_values"] = torch.randn(rows * m, PATCH_DIM, generator=gen)
        out["image_grid_thw"] = torch.tensor([list(QWEN2_VL_GRID)] * rows)
    return out


PROMPTS = {"video": (1, False), "image-and-video": (1, True), "padded-batch-of-2": (2, False)}


@pytest.fixture(scope="module")
def model():
    return TINY_CASES["qwen2_vl"].build()


_EXPORTS: dict = {}


def _exported(model, backend):
    if backend not in _EXPORTS:
        exporter, config = exporter_for(backend)
        _EXPORTS[backend] = exporter.export_for_generation(model, TINY_CASES["qwen2_vl"].inputs(2, 6), config)
    return _EXPORTS[backend]


def _eager(model, inputs):
    with torch.no_grad():
        return model.generate(**inputs, max_new_tokens=NEW, do_sample=False)


@pytest.mark.parametrize("backend", ["dynamo", pytest.param("onnx", marks=pytest.mark.sweep)])
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_video_prompt_generates_like_eager(model, backend, prompt):
    inputs = _prompt(*PROMPTS[prompt])
    want = _eager(model, inputs)
    # the same text with the video's tokens but no frames would not run; without the video block it must differ
    plain_ids = inputs["input_ids"].masked_fill(inputs["input_ids"] == VIDEO_ID, 5)
    plain = _eager(model, {"input_ids": plain_ids, "attention_mask": inputs["attention_mask"]})
    start = inputs["input_ids"].shape[1]
    assert not torch.equal(want[:, start:], plain[:, start:]), "the video does not change eager's tokens"
    got = _exported(model, backend).generate(**inputs, max_new_tokens=NEW)
    assert torch.equal(got, want), (got[:, start:], want[:, start:])


def test_videos_of_a_model_without_merged_videos_are_refused(model):
    llava = TINY_CASES["llava"]
    exported = DynamoExporter().export_for_generation(llava.build(), llava.inputs(1, 4), DynamoConfig(dynamic=True))
    inputs = llava.inputs(1, 4)
    inputs["pixel_values_videos"] = torch.zeros(1, 3, 16, 16)
    with pytest.raises(UnsupportedError, match="llava videos are not supported yet"):
        exported.generate(**inputs, max_new_tokens=2)


# rows, frames: one video; a left-padded batch of two; the export's sample has two rows of two frames
LLAVA_NEXT_VIDEO_PROMPTS = {"video": (1, 4), "padded-batch-of-2": (2, 3)}


@pytest.fixture(scope="module")
def next_video_model():
    return llava_next_video()


def _next_video_exported(model, backend):
    key = ("llava_next_video", backend)
    if key not in _EXPORTS:
        exporter, config = exporter_for(backend)
        _EXPORTS[key] = exporter.export_for_generation(model, llava_next_video_inputs(2, 2), config)
    return _EXPORTS[key]


@pytest.mark.parametrize("backend", ["dynamo", pytest.param("onnx", marks=pytest.mark.sweep)])
@pytest.mark.parametrize("prompt", list(LLAVA_NEXT_VIDEO_PROMPTS))
def test_llava_next_video_prompt_generates_like_eager(next_video_model, backend, prompt):
    inputs = llava_next_video_inputs(*LLAVA_NEXT_VIDEO_PROMPTS[prompt], seed=1)
    want = _eager(next_video_model, inputs)
    plain_ids = inputs["input_ids"].masked_fill(inputs["input_ids"] == VIDEO_ID, 5)
    plain = _eager(next_video_model, {"input_ids": plain_ids, "attention_mask": inputs["attention_mask"]})
    start = inputs["input_ids"].shape[1]
    assert not torch.equal(want[:, start:], plain[:, start:]), "the video does not change eager's tokens"
    exported = _next_video_exported(next_video_model, backend)
    assert "image_encoder" in exported.components and "vision_resampler" not in exported.components
    got = exported.generate(**inputs, max_new_tokens=NEW)
    assert torch.equal(got, want), (got[:, start:], want[:, start:])


def test_llava_next_video_images_are_refused_by_name(next_video_model):
    # get_image_features packs each image's any-resolution tiles with the image_newline parameter
    # (LlavaNextVideoModel.pack_image_features): no exported part carries that layout or weight
    inputs = llava_next_video_inputs(1, 2)
    inputs["pixel_values"] = torch.zeros(1, 2, 3, 16, 16)
    inputs["image_sizes"] = torch.tensor([[16, 16]])
    with pytest.raises(UnsupportedError, match="llava_next_video images are tiled at any resolution"):
        _next_video_exported(next_video_model, "dynamo").generate(**inputs, max_new_tokens=2)


def test_llava_next_video_conv_pooling_is_refused_at_export(next_video_model):
    # spatial_pool_mode="conv" pools with the vision_resampler's convolution weights, which no exported part carries
    # (the released checkpoints pool by average); the capture's merge check runs the video glue and refuses it
    from transformers import LlavaNextVideoForConditionalGeneration

    from hfexport.testing.tiny_multimodal import instantiate

    config = next_video_model.config.__class__.from_dict(next_video_model.config.to_dict())
    config.spatial_pool_mode = "conv"
    model = instantiate(LlavaNextVideoForConditionalGeneration, config)
    with pytest.raises(UnsupportedError, match="spatial_pool_mode='conv'"):
        DynamoExporter().export_for_generation(model, llava_next_video_inputs(1, 2), DynamoConfig(dynamic=True))
