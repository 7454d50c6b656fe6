"""Families the support matrix could not build, feed or generate with, run through the matrix's own worker: the
export's greedy tokens against eager ``model.generate`` (the worker compares them token for token and reports the
first difference). Each was a cannot-build, no-inputs or fail row before (issue 22). The default suite runs the
cheap ones; the rest are in the sweep (make test-sweep) and in the matrix's own rows, for the suite's time."""

from __future__ import annotations

import pytest

from hfexport.tools.matrix.discovery import discover
from hfexport.tools.matrix.worker import run_case

CASES = [
    ("vipllava", "generate"),  # its feature layers without the CLS token (glue), two layers of the tiny tower
    # its default config leaves num_key_value_heads unset
    pytest.param("moonshine_streaming", "generate", marks=pytest.mark.sweep),
    ("shieldgemma2", "export"),  # Gemma 3's image tokens (16 patches pooled 2 x 2)
    # its projector is an `aligner`: the glue took the tower's pooled output instead
    pytest.param("deepseek_vl", "generate", marks=pytest.mark.sweep),
    pytest.param("janus", "generate", marks=pytest.mark.sweep),
    # its generate() hands forward pixel_values=None beside the encoders' outputs, and its decode graph takes the
    # grid as a constant None: capture put the inputs back only where absent, generation passed the grid each step
    pytest.param("hunyuan_vl", "generate", marks=pytest.mark.sweep),
    # its tower's patch grid pixel-shuffled before the projector (glue.BEFORE_PROJECTOR)
    pytest.param("internvl", "generate", marks=pytest.mark.sweep),
    ("dbrx", "generate"),  # its experts loop over the experts hit (workaround dbrx-batched-experts)
    # its generate passes no position_ids: one row counted over the padded prompt, and a decode graph that computes
    # its own (the loop fed the mask's [batch, seq] positions to both)
    pytest.param("exaone4_5", "generate", marks=pytest.mark.sweep),
    # the glue does not reproduce their image parts (two towers, a visual vocabulary, any-resolution tiles packed
    # with image_newline, a tower over derived inputs): their own get_image_features is one exported part
    pytest.param("ovis2", "generate", marks=pytest.mark.sweep),
    # and the deepstack features its get_image_features returns beside them
    pytest.param("granite_docling", "generate", marks=pytest.mark.sweep),
    # (LLaVA-NeXT: test_a_model_the_glue_cannot_split_exports_its_own_get_image_features, in the default suite)
    pytest.param("llava_next", "generate", marks=pytest.mark.sweep),
    pytest.param("paddleocr_vl", "generate", marks=pytest.mark.sweep),
    pytest.param("deepseek_vl_hybrid", "generate", marks=pytest.mark.sweep),
    pytest.param("idefics2", "generate", marks=pytest.mark.sweep),
    pytest.param("hyperclovax_vision_v2", "generate", marks=pytest.mark.sweep),
    pytest.param("deepseek_ocr2", "generate", marks=pytest.mark.sweep),
    pytest.param("llava_onevision", "generate", marks=pytest.mark.sweep),
    pytest.param("llava_next_video", "generate", marks=pytest.mark.sweep),
    # an image prompt to a model with an audio tower too: the silent audio tower is left out of the export; Qwen2.5-
    # Omni's rope index finds the media by their token ids (no mm_token_type_ids)
    # (Qwen3-Omni's capture: test_an_export_captured_without_audio_refuses_an_audio_prompt_by_name, default suite)
    pytest.param("qwen3_omni_moe_thinker", "generate", marks=pytest.mark.sweep),
    pytest.param("qwen2_5_omni_thinker", "generate", marks=pytest.mark.sweep),
    pytest.param("dots3_note", "generate", marks=pytest.mark.sweep),
    # generate() runs the inner language model's own generate on the merged inputs_embeds: the prefill is the outer
    # forward, the decode the inner model's step (BLIP-2; InstructBLIP's Q-Former prompt fed to get_image_features)
    pytest.param("blip-2", "generate", marks=pytest.mark.sweep),
    # Kosmos-2's text model generates with the image embeddings at the positions of image_embeds_position_mask (no
    # placeholder id): its prefill graph runs the vision tower, the mask goes to the prompt's call only
    pytest.param("kosmos-2", "generate", marks=pytest.mark.sweep),
    pytest.param("instructblip", "generate", marks=pytest.mark.sweep),
    # its random masking takes the matrix's noise input, which its forward would draw with torch.rand (the export
    # differed from eager by 15 on ids_restore; ONNX Runtime has no RandomUniformLike-22 kernel)
    ("vit_mae", "export"),
    # its forward builds its own MiniMaxCache (linear-attention states beside the KV layers) and refuses any other:
    # the capture lets it, where it built a DynamicCache for every model
    pytest.param("minimax", "generate", marks=pytest.mark.sweep),
    # Dynamo traces the sample's branch of code that branches on tensor values, asserted at run time (19 s: the
    # sweep; the matrix's led rows run it on every backend)
    pytest.param("led", "generate", marks=pytest.mark.sweep),
    # its language model is a whole ForCausalLM (logits, no separate lm_head); its grid is [height, width]
    pytest.param("nemotron_h_omni", "generate", marks=pytest.mark.sweep),
    # its features are added to the placeholders' embeddings (the capture: test_features_added_to_..., default suite),
    # and its decode step takes the prompt's image_num_crops
    pytest.param("molmo2", "generate", marks=pytest.mark.sweep),
]


@pytest.mark.parametrize("model_type,stage", CASES)
def test_the_family_exports_and_generates_like_eager(model_type, stage):
    (arch,) = discover([f"={model_type}"])
    result = run_case(arch.model_type, arch.class_name, arch.task, "dynamo", stage)
    assert result["status"] == "pass", result["reason"]
    if stage == "generate":
        assert result["mismatched_tokens"] == 0
    else:
        assert result["max_abs_diff"] <= 1e-4


def test_a_model_the_glue_cannot_split_exports_its_own_get_image_features():
    """LLaVA-NeXT packs each image's any-resolution tiles with its image_newline weight inside get_image_features,
    which the tower + projector glue does not reproduce: the export's image part is the model's get_image_features
    (component "image_features", no "image_encoder"), and the image changes eager's tokens, which the export keeps."""
    import copy

    import torch

    from hfexport import DynamoConfig, DynamoExporter
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    model = build_model("llava_next", "LlavaNextForConditionalGeneration").eval()
    inputs = sample_inputs(model, "llava_next", batch=2, seq=6, for_generation=True)
    assert inputs["pixel_values"].dim() == 5  # tiles per image
    exported = DynamoExporter().export_for_generation(model, inputs, DynamoConfig(dynamic=True))
    assert "image_features" in exported.components and "image_encoder" not in exported.components
    image_token = model.config.image_token_index
    text_only = {"input_ids": inputs["input_ids"].masked_fill(inputs["input_ids"] == image_token, 5),
                 "attention_mask": inputs["attention_mask"]}
    with torch.no_grad():
        want = model.generate(**copy.deepcopy(inputs), max_new_tokens=8, do_sample=False)
        plain = model.generate(**text_only, max_new_tokens=8, do_sample=False)
    assert not torch.equal(want, plain)  # the image changes eager's tokens
    assert torch.equal(exported.generate(**inputs, max_new_tokens=8), want)


def test_an_export_captured_without_audio_refuses_an_audio_prompt_by_name():
    """Qwen3-Omni's thinker captured with an image prompt has no audio encoder part: a clip given to its generate()
    is refused, naming the missing encoder, not dropped."""
    import torch

    from hfexport import DynamoConfig, DynamoExporter, UnsupportedError
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    model = build_model("qwen3_omni_moe_thinker", "Qwen3OmniMoeThinkerForConditionalGeneration").eval()
    inputs = sample_inputs(model, "qwen3_omni_moe_thinker", batch=2, seq=6, for_generation=True)
    assert "pixel_values" in inputs and "input_features" not in inputs
    exported = DynamoExporter().export_for_generation(model, inputs, DynamoConfig(dynamic=True))
    assert "image_encoder" in exported.components and "audio_encoder" not in exported.components
    clip = dict(inputs, input_features=torch.zeros(2, model.config.audio_config.num_mel_bins, 20))
    with pytest.raises(UnsupportedError, match=r"no audio encoder.*captured with a prompt without audio.*input_feat"):
        exported.generate(**clip, max_new_tokens=2)


def test_rwkv_decodes_each_row_of_a_batch_as_it_decodes_alone():
    """transformers' RWKV mixes a one-token step's [batch, 1, hidden] states with the state's [batch, hidden]: eager's
    batch of 2 decodes each row with the other's state too (the premise, checked first). The export (workaround
    rwkv-batched-step-shift) decodes a batch of 2 as eager decodes each row alone, and a batch of 1 from the same
    export (its decode graph no longer pinned to the sample's batch)."""
    import warnings

    import torch

    from hfexport import DynamoConfig, DynamoExporter
    from hfexport.tools.matrix.overrides import GENERATE_ONE_ROW
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    model = build_model("rwkv", "RwkvForCausalLM").eval()
    gen = torch.Generator().manual_seed(0)
    capture = torch.randint(1, 256, (2, 6), generator=gen)
    ids = torch.randint(1, 256, (2, 9), generator=gen)
    with torch.no_grad():
        alone = torch.cat([model.generate(input_ids=ids[i:i + 1], attention_mask=torch.ones_like(ids[i:i + 1]),
                                          max_new_tokens=8, do_sample=False) for i in range(2)])
        batched = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert not torch.equal(batched, alone)  # the upstream bug this works around
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = DynamoExporter().export_for_generation(
            model, {"input_ids": capture, "attention_mask": torch.ones_like(capture)}, DynamoConfig(dynamic=True))
    assert "rwkv-batched-step-shift" in exported.components["decode"].metadata.workarounds
    assert torch.equal(exported.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=8), alone)
    assert torch.equal(exported.generate(input_ids=ids[1:], max_new_tokens=8), alone[1:])
    assert "rwkv" in GENERATE_ONE_ROW  # the matrix compares one row with eager


def test_features_added_to_the_placeholder_embeddings_are_captured_with_that_embedding():
    """Molmo 2 adds its image features to the image tokens' embeddings where other models replace them: the image
    part's output carries that embedding row, so that replacing the placeholders with it gives the model's own
    inputs_embeds (the replacing reading is off by the embedding)."""
    import torch

    from hfexport.capture.glue import merge_image_features
    from hfexport.capture.image_features import image_features_part
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    model = build_model("molmo2", "Molmo2ForConditionalGeneration").eval()
    inputs = sample_inputs(model, "molmo2", batch=2, seq=6, for_generation=True)
    seen = {}
    hook = model.model.language_model.register_forward_pre_hook(
        lambda module, args, kwargs: seen.update(embeds=kwargs["inputs_embeds"]) or None, with_kwargs=True)
    with torch.no_grad():
        model(**inputs)
    hook.remove()
    embed = model.get_input_embeddings()
    part, kwargs = image_features_part(model, inputs, embed, seen["embeds"])
    token = model.config.image_token_id
    assert torch.equal(part.placeholder, embed.weight[token])
    with torch.no_grad():
        features = part(**kwargs)
        ids = inputs["input_ids"]
        replaced = merge_image_features(ids, embed(ids), features - part.placeholder, token)
        merged = merge_image_features(ids, embed(ids), features, token)
    torch.testing.assert_close(merged, seen["embeds"], rtol=1e-5, atol=1e-6)
    assert (replaced - seen["embeds"]).abs().max() > 1e-3
