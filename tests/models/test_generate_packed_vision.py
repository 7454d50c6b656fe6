"""Image-text models over a packed vision tower (Qwen3-VL with its deepstack features, GLM-4V) generate what eager
``model.generate`` does from the exported parts, on images of other sizes than the capture's: the tower's grid-derived
inputs are derived again from each prompt's grid (``metadata.derived_inputs``), and Qwen3-VL's language model gets
the image tokens' mask and the tower's deepstack features. Before (issue 22) these models read no-inputs or failed to
trace the tower (GuardOnDataDependentSymNode)."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, UnsupportedError
from hfexport.tools.matrix.inputs import sample_inputs
from hfexport.tools.matrix.shrink import build_model

NEW_TOKENS = 12
CASES = {"qwen3_vl": "Qwen3VLForConditionalGeneration", "glm4v": "Glm4vForConditionalGeneration"}


@pytest.fixture(scope="module", params=sorted(CASES))
def exported_case(request):
    model = build_model(request.param, CASES[request.param])
    capture = sample_inputs(model, request.param, batch=2, seq=6, for_generation=True)
    exported = DynamoExporter().export_for_generation(model, capture, DynamoConfig(dynamic=True))
    return request.param, model, exported


def _prompt(model, grids: list[list[int]], text: int = 5, seed: int = 3) -> dict[str, torch.Tensor]:
    """One image a row, of the given ``[t, h, w]`` patch grid, in the processor's layout: left padding,
    ``<vision_start>`` (GLM: ``<image_start>``), an image token per merged patch, its end token, then text."""
    config, vision = model.config, model.config.vision_config
    merge = vision.spatial_merge_size
    start, end = ((getattr(config, f"{k}_start_token_id", None), getattr(config, f"{k}_end_token_id", None))
                  for k in ("vision", "image"))
    start, end = start if start[0] is not None else end  # (Qwen's vision_start, GLM's image_start)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for t, h, w in grids:
        image = [config.image_token_id] * (t * h * w // merge ** 2)
        words = torch.randint(3, 200, (text,), generator=gen).tolist()
        rows.append([start, *image, end, *words])
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    patches = sum(t * h * w for t, h, w in grids)
    size = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    return {"input_ids": ids, "attention_mask": mask, "mm_token_type_ids": (ids == config.image_token_id).long(),
            "pixel_values": torch.randn(patches, size, generator=gen), "image_grid_thw": torch.tensor(grids)}


def _assert_same_tokens(model, exported, inputs):
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    got = exported.generate(**inputs, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, expected), f"\neager:    {expected[:, -NEW_TOKENS:]}\nexported: {got[:, -NEW_TOKENS:]}"


def test_images_of_other_sizes_generate_like_eager(exported_case):
    name, model, exported = exported_case
    assert "packed-vision-attention" in exported.components["image_encoder"].metadata.workarounds
    assert exported.components["image_encoder"].metadata.derived_inputs
    if name == "qwen3_vl":  # the deepstack inputs reach the language model (else it would not match eager)
        assert exported.components["language_model"].metadata.kwargs.keys() >= {"visual_pos_masks",
                                                                                 "deepstack_visual_embeds"}
    _assert_same_tokens(model, exported, _prompt(model, [[1, 4, 8], [1, 8, 4]]))
    _assert_same_tokens(model, exported, _prompt(model, [[1, 4, 4]], text=9))


@pytest.mark.parametrize("exported_case", ["qwen3_vl"], indirect=True)  # (the one whose language model takes them)
def test_deepstack_with_a_video_is_refused_by_name(exported_case):
    _, model, exported = exported_case
    inputs = _prompt(model, [[1, 4, 4]])
    inputs["pixel_values_videos"] = inputs["pixel_values"].clone()
    inputs["video_grid_thw"] = inputs["image_grid_thw"].clone()
    with pytest.raises(UnsupportedError, match="deepstack features of both images and videos"):
        exported.generate(**inputs, max_new_tokens=2)
