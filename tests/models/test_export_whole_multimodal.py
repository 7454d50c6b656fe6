"""A whole M-RoPE image-text model (Qwen2.5-VL: packed vision tower with windows, 3D text positions) as one graph,
fed images: the tower's grid-derived inputs (``image_cu_seqlens``, ...) and the text's 3D positions (the model
class's own ``compute_3d_position_ids``) are recorded at export and derived again from the caller's prompt. Before
(issue 22), ``export()`` of such a model with an image failed to trace on every backend (GuardOnDataDependentSymNode
in ``get_vision_window_index`` and ``get_rope_index``), and ExecuTorch could not size the per-image split of the
features the forward concatenates again."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, ExportedModel, OnnxConfig, OpenVINOConfig
from hfexport.errors import UnsupportedError
from hfexport.exporter_dynamo import DynamoExporter
from hfexport.tools.matrix.inputs import sample_inputs
from hfexport.tools.matrix.shrink import build_model


@pytest.fixture(scope="module")
def model():
    return build_model("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration")


def _prompt(model, rows: list[list[tuple[int, int]]], seed: int = 0, lead: int = 3) -> dict[str, torch.Tensor]:
    """What the processor gives for ``rows`` of images (``(h, w)`` patches each) between a few text tokens: the
    image tokens wrapped in vision start / end, left padding, token types, patches and grids."""
    config, vision = model.config, model.config.vision_config
    gen = torch.Generator().manual_seed(seed)
    ids, pixels, grids = [], [], []
    width = vision.in_channels * vision.temporal_patch_size * vision.patch_size ** 2
    for images in rows:
        row = torch.randint(10, 100, (lead,), generator=gen).tolist()
        for h, w in images:
            row += [config.vision_start_token_id, *[config.image_token_id] * (h * w // vision.spatial_merge_size ** 2),
                    config.vision_end_token_id, *torch.randint(10, 100, (2,), generator=gen).tolist()]
            grids.append([1, h, w])
            pixels.append(torch.randn(h * w, width, generator=gen))
        ids.append(row)
    longest = max(map(len, ids))
    input_ids = torch.tensor([[0] * (longest - len(r)) + r for r in ids])
    return {"input_ids": input_ids, "attention_mask": torch.tensor([[0] * (longest - len(r)) + [1] * len(r) for r in ids]),
            "pixel_values": torch.cat(pixels), "image_grid_thw": torch.tensor(grids),
            "mm_token_type_ids": (input_ids == config.image_token_id).long()}


def _check(exported, model, prompt) -> None:
    with torch.no_grad():
        expected = model(**prompt).logits
    got = exported(**prompt).logits
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 1e-4


def test_a_whole_mrope_model_exports_with_images_and_runs_on_other_image_sizes(model, tmp_path):
    sample = sample_inputs(model, "qwen2_5_vl")  # two rows, a 4x4-patch image each
    assert sample["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
    exported = DynamoExporter().export(model, sample, config=DynamoConfig(dynamic=True))
    recipes = {(d.helper, d.prefix): d for d in exported.components["model"].metadata.derived_inputs}
    assert recipes[("compute_3d_position_ids", "")].args == {"owner": "Qwen2_5_VLModel"}
    assert {("get_vision_window_index", "image_"), ("get_vision_attention_seqlens", "image_")} <= set(recipes)
    assert {"position_ids", "image_cu_seqlens", "image_window_index"} <= set(exported.components["model"].metadata.kwargs)
    exported.save_pretrained(tmp_path / "qwen2_5_vl")
    loaded = ExportedModel.from_pretrained(tmp_path / "qwen2_5_vl")
    other = _prompt(model, [[(4, 8)], [(8, 4)]])  # other sizes, other positions, another prompt length
    for m in (exported, loaded):
        _check(m, model, other)
    with pytest.raises(UnsupportedError, match="number of images"):  # three images: fixed at two by the trace
        exported(**_prompt(model, [[(4, 4)], [(4, 4), (4, 4)]]))


def test_the_callers_own_position_ids_win(model):
    sample = sample_inputs(model, "qwen2_5_vl")
    exported = DynamoExporter().export(model, sample, config=DynamoConfig(dynamic=True))
    prompt = _prompt(model, [[(4, 8)], [(8, 4)]], seed=1)
    text = (prompt["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    plain = {**prompt, "position_ids": text[None].expand(3, -1, -1).contiguous()}  # 1D positions on all 3 axes
    with torch.no_grad():
        assert (model(**plain).logits - model(**prompt).logits).abs().max() > 1e-3  # the option changes eager's
    _check(exported, model, plain)


@pytest.mark.parametrize("config", [
    OnnxConfig(dynamic=True),
    # (20 s; the default suite keeps a vision tower on OpenVINO against eager, test_openvino_multimodal, and the
    # matrix runs the whole VLMs on it)
    pytest.param(OpenVINOConfig(dynamic=True), marks=pytest.mark.sweep),
], ids=["onnx", "openvino"])
def test_onnx_and_openvino_take_other_image_sizes(model, config, tmp_path):
    pytest.importorskip("onnxruntime" if isinstance(config, OnnxConfig) else "openvino",
                        reason="the backend's extra is not installed (hfexport[onnx] / hfexport[openvino])")
    from hfexport import AutoHfExporter

    exported = AutoHfExporter.from_config(config).export(model, sample_inputs(model, "qwen2_5_vl"), config=config)
    exported.save_pretrained(tmp_path / "export")
    loaded = ExportedModel.from_pretrained(tmp_path / "export")
    for m in (exported, loaded):
        _check(m, model, _prompt(model, [[(4, 8)], [(8, 4)]]))


@pytest.mark.sweep  # (28 s; the matrix's qwen2_5_vl ExecuTorch export row checks the same fold at its sample)
def test_executorch_folds_the_per_image_split(model):
    pytest.importorskip("executorch", reason="the ExecuTorch extra is not installed (hfexport[executorch])")
    from hfexport import ExecutorchConfig
    from hfexport.exporter_executorch import ExecutorchExporter

    sample = sample_inputs(model, "qwen2_5_vl")
    exported = ExecutorchExporter().export(model, sample, config=ExecutorchConfig(dynamic=False))
    assert "executorch-sort-as-topk" in exported.components["model"].metadata.workarounds  # (the tower's argsort)
    _check(exported, model, sample)
    other = _prompt(model, [[(4, 4)], [(4, 4)]], seed=2, lead=4)  # the sample's shapes, the images elsewhere
    assert other["input_ids"].shape == sample["input_ids"].shape
    _check(exported, model, other)


def test_hunyuan_vl_traces_past_its_python_count_check():
    """HunYuan-VL checks the image tokens against the features with a Python ``raise`` (workaround
    ``placeholder-count-check``); its 3D positions come from its own ``compute_3d_position_ids`` too."""
    hunyuan = build_model("hunyuan_vl", "HunYuanVLForConditionalGeneration")
    sample = sample_inputs(hunyuan, "hunyuan_vl")
    exported = DynamoExporter().export(hunyuan, sample, config=DynamoConfig(dynamic=False))
    metadata = exported.components["model"].metadata
    assert "placeholder-count-check" in metadata.workarounds
    assert any(d.helper == "compute_3d_position_ids" for d in metadata.derived_inputs)
    _check(exported, hunyuan, sample)
    with pytest.raises(ValueError, match="do not match"):  # the model's own check, untouched outside the trace
        hunyuan(**{**sample, "input_ids": sample["input_ids"].masked_fill(
            sample["input_ids"] == hunyuan.config.image_token_id, 5)})
