"""Image-text-to-text exports generate exactly what eager ``model.generate`` does, from the exported parts alone.

One export per model (a left-padded batch of 2, one image per row), then prompts of other lengths, other image
counts and sizes, another batch size, and a reload from disk. Greedy tokens must be equal, token for token.
"""

from __future__ import annotations


import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter, ExportedModel, UnsupportedError
from hfexport.capture.multimodal import decompose_multimodal, is_multimodal
from hfexport.testing.tiny import TINY_CASES
from hfexport.testing.tiny_multimodal import (
    IMAGE_ID,
    LLAVA_IMAGE,
    LLAVA_IMAGE_TOKENS,
    PAD_ID,
    QWEN2_VL_MERGE,
    QWEN2_VL_PATCH,
    QWEN2_VL_TEMPORAL,
    VISION_END_ID,
    VISION_START_ID,
)

NEW_TOKENS = 32
CASES = ["qwen2_vl", "llava"]
# the spec's keys, plus embed_tokens: the language model is called with inputs_embeds, so the text embedding
# lookup is its own graph and the token merge runs between it and the language model
KEYS = {
    "qwen2_vl": {"image_encoder", "embed_tokens", "language_model", "lm_head", "decode"},  # projector in the tower
    "llava": {"image_encoder", "multi_modal_projector", "embed_tokens", "language_model", "lm_head", "decode"},
}


@pytest.fixture(scope="module", params=CASES)
def exported_case(request):
    case = TINY_CASES[request.param]
    model = case.build()
    exported = DynamoExporter().export_for_generation(model, case.inputs(2, 6), DynamoConfig(dynamic=True))
    return request.param, case, model, exported


def _assert_same_tokens(model, exported, inputs):
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    got = exported.generate(**inputs, max_new_tokens=NEW_TOKENS)
    assert got.shape == expected.shape
    assert torch.equal(got, expected), f"\neager:    {expected[:, -NEW_TOKENS:]}\nexported: {got[:, -NEW_TOKENS:]}"


def test_component_keys_follow_the_spec(exported_case):
    name, _, _, exported = exported_case
    assert set(exported.components) == KEYS[name]


@pytest.mark.parametrize("seq", [6, 9])
def test_generate_matches_eager(exported_case, seq):
    _, case, model, exported = exported_case
    _assert_same_tokens(model, exported, case.inputs(2, seq))


def test_other_batch_sizes_match_eager(exported_case):
    _, case, model, exported = exported_case
    _assert_same_tokens(model, exported, case.inputs(1, 7))
    _assert_same_tokens(model, exported, case.inputs(3, 5))


def test_rows_with_different_image_counts_match_eager(exported_case):
    name, _, model, exported = exported_case
    _assert_same_tokens(model, exported, _two_and_one_images(name))


def test_text_only_prompt_matches_eager(exported_case):
    name, case, model, exported = exported_case
    inputs = case.inputs(2, 6)
    ids = inputs["input_ids"].masked_fill(inputs["input_ids"] >= 248, 7)
    text = {"input_ids": ids, "attention_mask": inputs["attention_mask"]}
    if name == "qwen2_vl":
        text["mm_token_type_ids"] = torch.zeros_like(ids)
    _assert_same_tokens(model, exported, text)


def test_reload_generates_the_same_tokens(exported_case, tmp_path):
    _, case, model, exported = exported_case
    exported.save_pretrained(tmp_path / "export")
    reloaded = ExportedModel.from_pretrained(tmp_path / "export")
    assert set(reloaded.components) == set(exported.components)
    inputs = case.inputs(2, 8)
    assert torch.equal(reloaded.generate(**inputs, max_new_tokens=NEW_TOKENS),
                       exported.generate(**inputs, max_new_tokens=NEW_TOKENS))
    _assert_same_tokens(model, reloaded, inputs)


def test_qwen2_vl_encoder_export_records_its_workaround_and_derived_inputs():
    case = TINY_CASES["qwen2_vl"]
    exported = DynamoExporter().export_for_generation(case.build(), case.inputs(1, 4), DynamoConfig(dynamic=True))
    encoder = exported.components["image_encoder"].metadata
    assert "packed-vision-attention" in encoder.workarounds
    assert "packed-vision-attention" not in exported.components["decode"].metadata.workarounds
    assert {d.helper for d in encoder.derived_inputs} >= {"get_vision_position_ids", "get_vision_attention_seqlens"}


def test_static_cache_matches_eager():
    case = TINY_CASES["llava"]
    model = case.build()
    gen = model.generation_config.__class__.from_dict(model.generation_config.to_dict())
    gen.cache_implementation, gen.max_cache_len = "static", 64
    exported = DynamoExporter().export_for_generation(model, case.inputs(2, 6), DynamoConfig(dynamic=True),
                                                      generation_config=gen)
    inputs = case.inputs(2, 8)
    run = model.generation_config.__class__.from_dict(gen.to_dict())
    run.max_new_tokens, run.do_sample = NEW_TOKENS, False
    with torch.no_grad():
        expected = model.generate(**inputs, generation_config=run)
    assert torch.equal(exported.generate(**inputs, max_new_tokens=NEW_TOKENS), expected)


# --- is_multimodal / decompose_multimodal ------------------------------------------------------------------------


@pytest.mark.parametrize("name", CASES)
def test_image_text_models_are_multimodal(name):
    assert is_multimodal(TINY_CASES[name].build())


def test_text_model_and_bare_module_are_not_multimodal():
    assert not is_multimodal(TINY_CASES["llama"].build())
    assert not is_multimodal(torch.nn.Linear(4, 4))


def test_decompose_multimodal_names_what_it_searched():
    case = TINY_CASES["llama"]
    with pytest.raises(ValueError, match="no known multimodal submodules.*get_encoder.*multi_modal_projector"):
        decompose_multimodal(case.build(), case.inputs(1, 4))


def test_decompose_multimodal_captures_each_part():
    case = TINY_CASES["llava"]
    model = case.build()
    inputs = case.inputs(2, 5)
    parts = decompose_multimodal(model, inputs)
    assert list(parts) == ["image_encoder", "multi_modal_projector", "embed_tokens", "language_model", "lm_head"]
    assert parts["image_encoder"][0] is model.model.vision_tower
    assert torch.equal(parts["image_encoder"][1]["pixel_values"], inputs["pixel_values"])
    assert parts["multi_modal_projector"][1]["image_features"].shape[:2] == (2, LLAVA_IMAGE_TOKENS)
    assert parts["language_model"][1]["inputs_embeds"].shape == (2, inputs["input_ids"].shape[1], 64)
    assert "input_ids" not in parts["language_model"][1]  # the merge happens before it, outside the graphs


# --- inputs with two images in one row and one in the other ---------------------------------------------------------


def _two_and_one_images(name: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    text = torch.randint(3, 248, (2, 5), generator=gen)
    if name == "llava":
        block = [IMAGE_ID] * LLAVA_IMAGE_TOKENS
        rows = [block + block + text[0].tolist(), block + text[1].tolist()]
        pixels = torch.randn(3, 3, LLAVA_IMAGE, LLAVA_IMAGE, generator=gen)
        extra = {"pixel_values": pixels}
    else:
        grids = torch.tensor([[1, 4, 4], [1, 4, 8], [1, 4, 4]])  # the second image is twice as wide

        def block(grid):
            return [VISION_START_ID] + [IMAGE_ID] * int(grid.prod() // QWEN2_VL_MERGE**2) + [VISION_END_ID]

        rows = [block(grids[0]) + block(grids[1]) + text[0].tolist(), block(grids[2]) + text[1].tolist()]
        patch = 3 * QWEN2_VL_TEMPORAL * QWEN2_VL_PATCH**2
        extra = {"pixel_values": torch.randn(int(grids.prod(-1).sum()), patch, generator=gen), "image_grid_thw": grids}
    width = max(len(r) for r in rows)
    ids = torch.tensor([[PAD_ID] * (width - len(r)) + r for r in rows])
    inputs = {"input_ids": ids, "attention_mask": (ids != PAD_ID).long(), **extra}
    if name == "qwen2_vl":
        inputs["mm_token_type_ids"] = (ids == IMAGE_ID).long()
    return inputs


# --- bidirectional blocks in the prompt: PaliGemma's prefix, Gemma3's images ----------------------------------------

# their language model is traced with the prepared 4D masks of the model's forward; generate() builds them with the
# model class's create_masks_for_generate from the prompt's token_type_ids
# (Gemma 3's in the sweep, for the suite's time: PaliGemma's takes the same path by default)
BLOCK_CASES = ["paligemma", pytest.param("gemma3_vl", marks=pytest.mark.sweep)]


def _causal_prompt(name, inputs):
    """The same prompt with the token types that make it attend causally (PaliGemma: suffix; Gemma3: text)."""
    types = inputs["token_type_ids"]
    return {**inputs, "token_type_ids": torch.ones_like(types) if name == "paligemma" else torch.zeros_like(types)}


@pytest.fixture(scope="module", params=BLOCK_CASES)
def block_case(request):
    case = TINY_CASES[request.param]
    model = case.build()
    exported = DynamoExporter().export_for_generation(model, case.inputs(2, 6), DynamoConfig(dynamic=True))
    return request.param, case, model, exported


def _assert_blocks_generate_like_eager(name, case, model, exported, batch, seq):
    inputs = case.inputs(batch, seq)
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
        causal = model.generate(**_causal_prompt(name, inputs), max_new_tokens=NEW_TOKENS, do_sample=False)
    assert not torch.equal(expected, causal), "this prompt's tokens do not depend on its bidirectional block"
    got = exported.generate(**inputs, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, expected), f"\neager:    {expected[:, -NEW_TOKENS:]}\nexported: {got[:, -NEW_TOKENS:]}"


def test_bidirectional_blocks_generate_like_eager(block_case):
    name, case, model, exported = block_case
    assert set(exported.components) == KEYS["llava"]
    assert exported.components["language_model"].metadata.kwargs["attention_mask"]["kind"] in ("tensor", "pytree")
    _assert_blocks_generate_like_eager(name, case, model, exported, 2, 9)


@pytest.mark.sweep
@pytest.mark.parametrize("batch,seq", [(1, 7), (3, 5)])
def test_bidirectional_blocks_at_other_batch_sizes_generate_like_eager(block_case, batch, seq):
    _assert_blocks_generate_like_eager(*block_case, batch, seq)


def test_block_masks_without_the_model_class_rule_are_refused(block_case, monkeypatch):
    _, case, model, exported = block_case
    monkeypatch.delattr(type(model), "create_masks_for_generate")
    with pytest.raises(UnsupportedError, match=f"{type(model).__name__}.*token_type_ids.*no create_masks_for_gen"):
        exported.generate(**case.inputs(2, 9), max_new_tokens=NEW_TOKENS)


@pytest.mark.sweep
def test_block_masks_after_a_reload_match_eager(block_case, tmp_path):
    _, case, model, exported = block_case
    exported.save_pretrained(tmp_path / "export")
    _assert_same_tokens(model, ExportedModel.from_pretrained(tmp_path / "export"), case.inputs(2, 8))


@pytest.mark.sweep
@pytest.mark.parametrize("name", BLOCK_CASES)
def test_block_masks_with_a_static_cache_match_eager(name):
    case = TINY_CASES[name]
    model = case.build()
    gen = model.generation_config.__class__.from_dict(model.generation_config.to_dict())
    gen.cache_implementation, gen.max_cache_len = "static", 96
    exported = DynamoExporter().export_for_generation(model, case.inputs(2, 6), DynamoConfig(dynamic=True),
                                                      generation_config=gen)
    run = model.generation_config.__class__.from_dict(gen.to_dict())
    run.max_new_tokens, run.do_sample = NEW_TOKENS, False
    for seq in (9, 7):  # batch 2 only: a Dynamo static-cache decode graph keeps the traced batch size
        inputs = case.inputs(2, seq)
        with torch.no_grad():
            expected = model.generate(**inputs, generation_config=run)
        assert torch.equal(exported.generate(**inputs, max_new_tokens=NEW_TOKENS), expected)


# matrix-tiny families whose glue differs from LLaVA's: Llama 4 calls a language model with its own head (a
# ForCausalLM: its output is logits, not hidden states) on every image's tokens flattened; Aria's projector maps its
# patches to a fixed number of queries; Mistral 3's patch merger takes every image's patches as one sequence and
# image_sizes (traced as the sample's values); Inkling's tower gives one 1024-wide row per image that the forward's
# masked_scatter spreads over 16 tokens of 64; Inkling 2's takes [tokens, 16, 16, 3] blocks of merged patches
@pytest.mark.parametrize("model_type, class_name", [pytest.param("llama4", "Llama4ForConditionalGeneration",
                                                                 marks=pytest.mark.sweep),  # (30 s: in the sweep)
                                                    pytest.param("aria", "AriaForConditionalGeneration",
                                                                 marks=pytest.mark.sweep),  # (~20 s)
                                                    ("mistral3", "Mistral3ForConditionalGeneration"),
                                                    pytest.param("inkling_mm_model", "InklingForConditionalGeneration",
                                                                 marks=pytest.mark.sweep),  # (~30 s)
                                                    pytest.param("inkling2", "Inkling2ForConditionalGeneration",
                                                                 marks=pytest.mark.sweep)])  # (~60 s)
def test_a_matrix_tiny_image_prompt_generates_like_eager(model_type, class_name):
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    model = build_model(model_type, class_name)
    inputs = sample_inputs(model, model_type, batch=2, seq=9, for_generation=True)
    token = getattr(model.config, "image_token_id", None)
    token = model.config.image_token_index if token is None else token
    assert (inputs["input_ids"] == token).sum() > 0  # an image prompt, not text only
    with torch.no_grad():  # (the image reaches the next-token logits; some tiny models repeat one token anyway)
        with_image = model(**inputs).logits[:, -1]
        blank = model(**{**inputs, "pixel_values": torch.zeros_like(inputs["pixel_values"])}).logits[:, -1]
    assert (with_image - blank).abs().max() > 1e-4, "the image does not change eager's logits"
    sample = sample_inputs(model, model_type, batch=2, seq=6, for_generation=True)
    exported = DynamoExporter().export_for_generation(model, sample, DynamoConfig(dynamic=True))
    _assert_same_tokens(model, exported, inputs)


def test_features_of_another_width_fill_the_placeholders_element_after_element_as_masked_scatter_does():
    """Inkling's tower gives one 1024-wide row per image for 16 tokens of 64: the forward's masked_scatter fills the
    positions element after element, and so does the merge (its generate case is in the sweep)."""
    from hfexport.capture.glue import merge_image_features

    ids = torch.tensor([[5, 9, 9, 9, 9, 6], [9, 9, 9, 9, 7, 8]])
    embeds, features = torch.randn(2, 6, 8), torch.randn(4, 16)  # 8 placeholder tokens of 8 = 4 rows of 16
    want = embeds.masked_scatter((ids == 9).unsqueeze(-1).expand_as(embeds), features)
    assert torch.equal(merge_image_features(ids, embeds, features, 9), want)
    with pytest.raises(UnsupportedError, match="8 image tokens .* give 3 features"):
        merge_image_features(ids, embeds, torch.randn(3, 16), 9)
