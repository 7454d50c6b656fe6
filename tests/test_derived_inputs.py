"""Packed vision towers (Qwen3-VL's, GLM-4V's, ...): the inputs they derive from their grid with transformers'
``vision_utils`` helpers are recorded at export and derived again from the caller's grid at run time, and their
attention traces as one masked call (workaround ``packed-vision-attention``). Before (issue 22), every such tower
failed to trace with ``GuardOnDataDependentSymNode`` on the grid's values."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, ExportedModel
from hfexport.derived import DerivedInput
from hfexport.exporter_dynamo import DynamoExporter
from hfexport.metadata import ExportMetadata
from hfexport.tools.matrix.shrink import build_model


def _patches(model, grid: list[list[int]], seed: int = 0) -> dict[str, torch.Tensor]:
    config = model.config
    width = config.in_channels * config.temporal_patch_size * config.patch_size ** 2
    n = sum(t * h * w for t, h, w in grid)
    gen = torch.Generator().manual_seed(seed)
    return {"hidden_states": torch.randn(n, width, generator=gen), "grid_thw": torch.tensor(grid)}


@pytest.fixture(scope="module")
def tower():
    return build_model("qwen3_vl_vision", "Qwen3VLVisionModel")


def test_a_derived_input_names_a_vision_utils_helper_and_plain_settings():
    with pytest.raises(ValueError, match="not one of"):
        DerivedInput("eval", "grid_thw", {}, ("cu_seqlens",))
    with pytest.raises(ValueError, match="plain numbers"):
        DerivedInput("get_vision_position_ids", "grid_thw", {"spatial_merge_size": torch.tensor([2])},
                     ("position_ids",))
    with pytest.raises(ValueError, match="not what"):
        DerivedInput("get_vision_cu_seqlens", "grid_thw", {}, ("position_ids",))
    entry = {"helper": "os.system", "source": "grid_thw", "args": {}, "keys": ["cu_seqlens"]}
    with pytest.raises(ValueError, match="not one of"):
        ExportMetadata.from_dict({"derived_inputs": [entry]})
    with pytest.raises(ValueError, match="derived_inputs"):
        ExportMetadata.from_dict({"derived_inputs": "get_vision_cu_seqlens"})


def test_a_packed_vision_tower_exports_and_runs_on_other_grids_than_its_sample(tower, tmp_path):
    sample = _patches(tower, [[1, 4, 4], [1, 4, 4]])
    exported = DynamoExporter().export(tower, sample, config=DynamoConfig(dynamic=True))
    metadata = exported.components["model"].metadata
    assert "packed-vision-attention" in metadata.workarounds
    helpers = {d.helper: d for d in metadata.derived_inputs}
    assert {"get_vision_attention_seqlens", "get_vision_position_ids",
            "get_vision_interpolation_indices_and_weights"} <= set(helpers)
    assert helpers["get_vision_position_ids"].args["spatial_merge_size"] == tower.config.spatial_merge_size
    assert {"cu_seqlens", "position_ids", "interp_indices", "interp_weights"} <= set(metadata.kwargs)
    exported.save_pretrained(tmp_path / "tower")
    loaded = ExportedModel.from_pretrained(tmp_path / "tower")
    # three images, none of the sample's size (patches of one must not attend to another's), then a single one
    for grid, tokens in (([[1, 4, 8], [1, 8, 4], [1, 2, 2]], 17), ([[1, 4, 4]], 4)):
        other = _patches(tower, grid, seed=1)
        with torch.no_grad():
            expected = tower(**other)
        for model in (exported, loaded):
            got = model(**other)
            assert got.pooler_output.shape == expected.pooler_output.shape == (tokens, tower.config.out_hidden_size)
            assert (got.pooler_output - expected.pooler_output).abs().max() < 1e-4
            for mine, theirs in zip(got.deepstack_features, expected.deepstack_features, strict=True):
                assert (mine - theirs).abs().max() < 1e-4


def test_the_callers_own_precomputed_tensor_wins(tower):
    sample = _patches(tower, [[1, 4, 4], [1, 4, 4]])
    exported = DynamoExporter().export(tower, sample, config=DynamoConfig(dynamic=True))
    cu_seqlens = torch.tensor([0, 32], dtype=torch.int32)  # both images as one: each patch sees all 32
    with torch.no_grad():
        expected = tower(**sample, cu_seqlens=cu_seqlens.clone())
        separate = tower(**sample)
    got = exported(**sample, cu_seqlens=cu_seqlens)
    assert (expected.pooler_output - separate.pooler_output).abs().max() > 1e-3  # the option changes eager's result
    assert (got.pooler_output - expected.pooler_output).abs().max() < 1e-4


@pytest.mark.parametrize("backend", ["onnx", "openvino",  # (ExecuTorch's 30 s lowering: the sweep's, for the suite's
                                     pytest.param("executorch", marks=pytest.mark.sweep)])  # 25 minutes)
def test_a_packed_vision_tower_runs_like_eager_on_every_backend(tower, backend):
    """ExecuTorch also needs its Conv3d patch embedding traced as a linear (workaround executorch-conv3d-patches):
    its portable convolution takes no 5-D input, and the program failed at run time with error 0x12."""
    import hfexport

    exporter = {"onnx": "OnnxExporter", "openvino": "OpenVINOExporter", "executorch": "ExecutorchExporter"}[backend]
    config = {"onnx": "OnnxConfig", "openvino": "OpenVINOConfig", "executorch": "ExecutorchConfig"}[backend]
    sample = _patches(tower, [[1, 4, 4], [1, 4, 4]])
    exported = getattr(hfexport, exporter)().export(tower, sample, config=getattr(hfexport, config)(dynamic=True))
    fired = exported.components["model"].metadata.workarounds
    assert "packed-vision-attention" in fired
    assert ("executorch-conv3d-patches" in fired) == (backend == "executorch")
    for grid in ([[1, 4, 8], [1, 2, 2]], [[1, 4, 4]]):
        other = _patches(tower, grid, seed=2)
        with torch.no_grad():
            expected = tower(**other).pooler_output
        got = exported(**other).pooler_output
        assert got.shape == expected.shape
        assert (got - expected).abs().max() < 1e-4


def test_a_weight_free_method_reads_what_the_instance_copies_from_its_config():
    """``ConfigOnly`` runs a model class's weight-free method (a rope index) on the config alone: an attribute its
    ``__init__`` copies from the config (Qwen3-Omni's thinker: ``self.spatial_merge_size`` from its vision config)
    is read there; one the config does not hold either stays an AttributeError."""
    from transformers import PretrainedConfig

    from hfexport.derived import ConfigOnly

    class Thinker:
        def __init__(self, config):
            self.spatial_merge_size = config.vision_config.spatial_merge_size

        def tokens(self, patches: int) -> int:
            return patches // self.spatial_merge_size**2

    config = PretrainedConfig()
    config.vision_config = PretrainedConfig(spatial_merge_size=2)
    assert ConfigOnly(Thinker, config).tokens(16) == Thinker(config).tokens(16) == 4
    with pytest.raises(AttributeError):
        ConfigOnly(Thinker, config).rope_theta


@pytest.mark.parametrize("model_type, class_name, prefix", [
    ("muse_glimmer", "MuseGlimmerForConditionalGeneration", ""),  # get_image_features passes kwargs on as they come
    ("qwen3_vl", "Qwen3VLForConditionalGeneration", "image_"),  # ... through accepts_precomputed_kwargs("image")
])
def test_an_image_features_part_keys_its_derived_inputs_as_its_get_image_features_passes_them(
        model_type, class_name, prefix):
    from hfexport.capture.derive import derive_vision_inputs
    from hfexport.capture.image_features import ImageFeatures, _owner
    from hfexport.tools.matrix.inputs import sample_inputs

    model = build_model(model_type, class_name).eval()
    sample = sample_inputs(model, model_type, batch=1, seq=6, for_generation=True)
    inputs = {"pixel_values": sample["pixel_values"], "image_grid_thw": sample["image_grid_thw"]}
    part = ImageFeatures(_owner(model)).eval()
    derived, recipes = derive_vision_inputs(part, inputs)
    assert recipes and {r.prefix for r in recipes} == {prefix}
    assert f"{prefix}cu_seqlens" in derived and all(name in derived for r in recipes for name in r.names)

    exported = DynamoExporter().export(part, inputs, DynamoConfig(dynamic=False))
    with torch.no_grad():
        eager = part(**inputs)
        eager = eager[0] if isinstance(eager, tuple) else eager
        got = exported(**inputs)
        got = got[0] if isinstance(got, tuple) else got
    assert (got - eager).abs().max() <= 1e-4


def test_a_helper_a_family_defines_itself_is_named_by_its_family_and_must_pop_its_keys():
    from transformers.models.muse_spark import modeling_muse_spark

    recipe = DerivedInput("muse_spark.get_vision_pixel_shuffle_index", "grid_thw", {"merge_size": 2},
                          ("pixel_shuffle_index",))
    grid = torch.tensor([[1, 4, 2], [1, 2, 2]])
    expected = modeling_muse_spark.get_vision_pixel_shuffle_index(grid, 2)
    assert torch.equal(recipe.compute({"grid_thw": grid})["pixel_shuffle_index"], expected)
    for helper in ("muse_spark.get_vision_missing", "os.get_vision_pixel_shuffle_index",
                   "muse_spark.get_placeholder_mask", "../muse_spark.get_vision_pixel_shuffle_index",
                   "muse_spark.get_vision_pixel_shuffle_index.__globals__"):
        with pytest.raises(ValueError, match="not one of"):
            DerivedInput(helper, "grid_thw", {}, ("pixel_shuffle_index",))
    with pytest.raises(ValueError, match="not what"):  # the keys are the ones its source pops
        DerivedInput("muse_spark.get_vision_pixel_shuffle_index", "grid_thw", {}, ("cu_seqlens",))


def _muse_patches(width: int, grid: list[list[int]], seed: int) -> dict[str, torch.Tensor]:
    n = sum(t * h * w for t, h, w in grid)
    return {"pixel_values": torch.randn(n, width, generator=torch.Generator().manual_seed(seed)),
            "grid_thw": torch.tensor(grid)}


def test_a_tower_with_a_family_helper_exports_and_runs_on_other_grids_than_its_sample(tmp_path):
    tower = build_model("muse_spark_vision", "MuseSparkVisionModel").eval()
    width = tower.patch_embedder.patch_embedding.in_features  # (3 channels x 2 frames x 8 x 8 pixels)
    exported = DynamoExporter().export(tower, _muse_patches(width, [[1, 4, 4], [1, 4, 4]], 0),
                                       config=DynamoConfig(dynamic=True))
    helpers = {d.helper for d in exported.components["model"].metadata.derived_inputs}
    assert "muse_spark.get_vision_pixel_shuffle_index" in helpers
    exported.save_pretrained(tmp_path / "tower")
    loaded = ExportedModel.from_pretrained(tmp_path / "tower")
    for grid in ([[1, 4, 8], [1, 2, 2]], [[1, 6, 4]]):  # another image count and sizes: another shuffle order
        other = _muse_patches(width, grid, 1)
        with torch.no_grad():
            expected = tower(**other).last_hidden_state
        for model in (exported, loaded):
            got = model(**other).last_hidden_state
            assert got.shape == expected.shape
            assert (got - expected).abs().max() <= 1e-4


def test_a_model_whose_get_image_features_lacks_the_prefix_stripping_decorator_gets_it_while_tracing(
        without_workaround, caplog):
    """With the decorator, the tower finds its precomputed inputs and the trace takes the grid symbolically; without
    it, the tower computes them from the grid's values in a Python loop, and the trace only gets past that by falling
    back to the sample's values (pinned, checked at run time)."""
    from transformers.models.muse_glimmer.modeling_muse_glimmer import MuseGlimmerModel

    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.workarounds.models.precomputed_kwargs import _decorated

    model = build_model("muse_glimmer", "MuseGlimmerForConditionalGeneration").eval()
    inputs = sample_inputs(model, "muse_glimmer")
    with caplog.at_level("WARNING", logger="hfexport.capture.trace"):
        exported = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
    assert "precomputed-kwargs-prefix" in exported.components["model"].metadata.workarounds
    assert "branches on tensor values" not in caplog.text
    with torch.no_grad():
        expected = model(**inputs).logits
    assert (exported(**inputs).logits - expected).abs().max() <= 1e-4
    assert not _decorated(MuseGlimmerModel.get_image_features)  # put back
    without_workaround("precomputed-kwargs-prefix")  # the premise: the tower meets image_* keys, not its own
    with caplog.at_level("WARNING", logger="hfexport.capture.trace"):
        DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
    assert "branches on tensor values (Could not extract specialized integer" in caplog.text


def test_the_same_image_mask_masks_an_eager_attention_too():
    """An eager attention adds its mask to the scores: the boolean "same image" mask added 1 within an image and
    masked nothing across (Inkling 2's tower, attention "eager": its image features off by 1e-5 of 0.1, enough to
    move its logits by 1e-3); the mask is additive now. Checked on the tower's patches run in eager with the
    workaround on and off."""
    from hfexport.capture.image_features import ImageFeatures, _owner
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.workarounds.registry import applied_workarounds

    torch.manual_seed(0)
    model = build_model("inkling2", "Inkling2ForConditionalGeneration").eval()
    assert model.config.vision_config._attn_implementation == "eager"
    inputs = sample_inputs(model, "inkling2")
    part = ImageFeatures(_owner(model)).eval()
    kwargs = {k: inputs[k] for k in ("pixel_values", "image_grid_thw")}
    assert int(kwargs["image_grid_thw"].shape[0]) == 2  # two images: a mask between them to get right
    with torch.no_grad():
        want = part(**kwargs)
        with applied_workarounds("dynamo", part, kwargs, ids=["packed-vision-attention"]) as fired:
            got = part(**kwargs)
    assert fired == ["packed-vision-attention"]
    assert (got - want).abs().max() < 1e-6
