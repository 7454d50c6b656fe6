"""Idefics3 / SmolVLM reshape their images before the vision model (every row's images in one batch, all-zero
padding images dropped, a patch mask pooled from the pixel mask); the export's glue derives the same encoder inputs
(capture.glue.IMAGE_INPUTS), so generate() from the exported parts gives eager's tokens."""

from __future__ import annotations

import warnings

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.capture.glue import derived_image_inputs
from hfexport.tools.matrix.inputs import sample_inputs
from hfexport.tools.matrix.shrink import build_model


@pytest.mark.parametrize("model_type,class_name", [("idefics3", "Idefics3ForConditionalGeneration"),
                                                   ("smolvlm", "SmolVLMForConditionalGeneration")])
def test_the_images_go_through_the_vision_model_as_the_model_sends_them(model_type, class_name):
    torch.manual_seed(0)
    model = build_model(model_type, class_name)
    capture = sample_inputs(model, model_type, batch=2, seq=6, for_generation=True)
    prompt = sample_inputs(model, model_type, batch=2, seq=9, for_generation=True)
    assert capture["pixel_values"].dim() == 5  # [batch, images, C, H, W], as the processor gives them
    # a padding image (all zeros) in row 1 is dropped before the vision model, as get_image_features does
    padded = torch.cat([prompt["pixel_values"], torch.zeros_like(prompt["pixel_values"][:, :1])], dim=1)
    derived = derived_image_inputs(model.config, {**prompt, "pixel_values": padded})
    assert derived["pixel_values"].shape[0] == prompt["pixel_values"].shape[0] * prompt["pixel_values"].shape[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = DynamoExporter().export_for_generation(model, capture, DynamoConfig(dynamic=True))
    assert "image_encoder" in exported.components
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(exported.generate(**prompt, max_new_tokens=8), expected)
