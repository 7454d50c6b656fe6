"""OpenVINO: what its PyTorch frontend does not convert as torch.export writes it, and the workarounds that convert
it (openvino-int32-item, openvino-complex-rotary on Llama-4's vision tower, openvino-split-to-bool,
openvino-mask-fill, openvino-integer-division, openvino-symbolic-floats; openvino-embedding-bag: tests/test_embedding_bag.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("openvino", reason="the OpenVINO backend's own package (pip install hfexport[openvino])")

from hfexport import OpenVINOConfig, OpenVINOExporter  # noqa: E402


class _Grid(torch.nn.Module):
    """MiniCPM-V's tower in small: the patch grid comes from an int32 ``target_sizes`` read with ``item()``."""

    def forward(self, x: torch.Tensor, target_sizes: torch.Tensor) -> torch.Tensor:
        rows, cols = target_sizes[0].item(), target_sizes[1].item()
        torch._check(rows * cols == x.shape[1])
        grid = x.view(x.shape[0], rows, cols, x.shape[-1])
        return grid.cumsum(1)[:, -1] * torch.arange(cols, dtype=x.dtype)[:, None]


def test_a_view_sized_by_int32_reads_converts_and_matches_eager(monkeypatch):
    """The frontend read each size as an i32 Squeeze and refused the view's shape list of i32 and i64 parts
    ("Argument element types are inconsistent"; checked below with the rewrite switched off)."""
    from hfexport.workarounds import openvino_item_dtype

    inputs = {"x": torch.randn(2, 12, 8), "target_sizes": torch.tensor([3, 4], dtype=torch.int32)}
    exported = OpenVINOExporter().export(_Grid(), inputs, OpenVINOConfig(dynamic=False))
    assert torch.allclose(exported(**inputs), _Grid()(**inputs), atol=1e-5)

    monkeypatch.setattr(openvino_item_dtype, "int64_item_reads", lambda program: 0)
    with pytest.raises(Exception, match="element types are inconsistent"):
        OpenVINOExporter().export(_Grid(), inputs, OpenVINOConfig(dynamic=False))


def test_llama4_vision_towers_complex_rotary_converts_and_matches_eager(monkeypatch):
    """Llama-4's vision tower multiplies its queries by a complex buffer: the frontend converted the buffer as real
    pairs and refused the complex view that broadcasts them ("is incompatible with input shape"; checked below
    with the tower left to the frontend); openvino-complex-rotary rotates with the real pairs."""
    from hfexport.tools.matrix.shrink import build_model
    from hfexport.validation import compare_outputs
    from hfexport.workarounds.models import complex_rotary

    torch.manual_seed(0)
    tower = build_model("llama4", "Llama4ForConditionalGeneration").vision_model
    size = tower.config.image_size
    inputs = {"pixel_values": torch.randn(2, tower.config.num_channels, size, size)}
    with torch.no_grad():
        eager = tower(**inputs)
    assert torch.is_complex(tower.rotary_embedding.freqs_ci)
    exported = OpenVINOExporter().export(tower, inputs, OpenVINOConfig(dynamic=False))
    assert "openvino-complex-rotary" in exported.components["model"].metadata.workarounds
    assert torch.is_complex(tower.rotary_embedding.freqs_ci)  # the buffer is the model's own again
    report = compare_outputs(exported(**inputs), eager)
    assert not report["problems"] and report["max_abs_diff"] <= 1e-4, report

    monkeypatch.setattr(complex_rotary, "_vision_rotaries", lambda model: [])
    with pytest.raises(Exception, match="incompatible with input shape"):
        OpenVINOExporter().export(tower, inputs, OpenVINOConfig(dynamic=False))


class _SplitMask(torch.nn.Module):
    """GLM-5-Next's indexer in small: packed states split unevenly, the last channel read as a mask."""

    def forward(self, packed: torch.Tensor) -> torch.Tensor:
        keys, scores, valid = torch.split(packed, [4, 4, 1], dim=-1)
        return torch.where(valid.bool(), keys * scores, torch.zeros_like(keys))


def test_an_uneven_split_piece_read_as_bool_compiles_and_matches_eager(monkeypatch):
    """VariadicSplit then Convert(boolean) did not compile ("Default output not supported"; checked below with the
    rewrite off); openvino-split-to-bool compares the piece with zero."""
    from hfexport.workarounds import openvino_split_to_bool

    packed = torch.randn(2, 5, 9)
    packed[..., -1] = torch.tensor([0.0, 1.0, 0.0, 2.0, float("nan")])  # zero, ones, and NaN (true, as in torch)
    model = _SplitMask()
    exported = OpenVINOExporter().export(model, {"packed": packed}, OpenVINOConfig(dynamic=False))
    assert torch.equal(torch.isnan(exported(packed=packed)), torch.isnan(model(packed)))
    assert torch.allclose(exported(packed=packed).nan_to_num(), model(packed).nan_to_num(), atol=1e-6)

    monkeypatch.setattr(openvino_split_to_bool, "split_pieces_compared_with_zero", lambda program: 0)
    unfixed = OpenVINOExporter().export(model, {"packed": packed}, OpenVINOConfig(dynamic=False))
    with pytest.raises(RuntimeError, match="Default output not supported"):
        unfixed(packed=packed)


class _TokenFill(torch.nn.Module):
    """Chameleon's logits in small: the image tokens' logits set to the dtype's minimum (a negative id included)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("image_tokens", torch.tensor([3, 5, -1]), persistent=False)

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits * 2
        logits[:, :, self.image_tokens] = torch.finfo(logits.dtype).min
        return logits


def test_a_value_written_at_ids_along_one_axis_converts_and_matches_eager(monkeypatch):
    """index_put(x, [None, None, ids], value) did not convert ("cannot convert SequenceMark, aten.index_put";
    checked below with the rewrite off); openvino-mask-fill writes it as a where over a mask of the ids."""
    from hfexport.workarounds import openvino_mask_fill

    logits = torch.randn(2, 4, 8)
    want = _TokenFill()(logits)
    assert (want[..., [3, 5, 7]] == torch.finfo(torch.float32).min).all() and not torch.equal(want, logits * 2)
    exported = OpenVINOExporter().export(_TokenFill(), {"logits": logits}, OpenVINOConfig(dynamic=False))
    assert torch.equal(exported(logits=logits), want)

    monkeypatch.setattr(openvino_mask_fill, "_is_axis_fill", lambda node: False)
    with pytest.raises(Exception, match="SequenceMark"):
        OpenVINOExporter().export(_TokenFill(), {"logits": logits}, OpenVINOConfig(dynamic=False))


class _Lengths(torch.nn.Module):
    """An audio tower's output lengths in small (Nemotron 3.5 Transcribe's ``ceil(frames / 8)``, then the real
    positions kept), beside a floor and a truncating division of negative integers."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor, offsets: torch.Tensor):
        lengths = (mask.sum(-1) + 7) // 8
        real = torch.arange(x.shape[1])[None, :] < lengths[:, None]
        return lengths, x[real], offsets // 8, torch.div(offsets, 3, rounding_mode="trunc")


def test_integer_divisions_match_eager_with_shapes_other_than_traced(monkeypatch):
    """The CPU plugin's integer Divide rounded (after a ReduceSum) or truncated where torch floors: 3 for
    (16 + 7) // 8, 0 for -5 // 8 (checked below with the rewrite off); openvino-integer-division divides a multiple
    of the divisor instead."""
    from hfexport.workarounds import openvino_integer_division

    def inputs(short: int) -> dict:
        mask = torch.ones(2, 32, dtype=torch.long)
        mask[0, short:] = 0
        return {"x": torch.randn(2, 4, 3), "mask": mask, "offsets": torch.tensor([-5, -16, 7, 23, -1])}

    model, sample, other = _Lengths(), inputs(24), inputs(16)
    want = model(**other)
    assert want[0].tolist() == [2, 4] and want[2].tolist() == [-1, -2, 0, 2, -1]
    exported = OpenVINOExporter().export(model, sample, OpenVINOConfig(dynamic=True))
    got = exported(**other)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True)), (got, want)

    monkeypatch.setattr(openvino_integer_division, "exact_integer_divisions", lambda program: 0)
    unfixed = OpenVINOExporter().export(model, sample, OpenVINOConfig(dynamic=True))(**other)
    assert unfixed[0].tolist() == [3, 5] and unfixed[1].shape[0] == 7 and unfixed[2].tolist()[0] == 0


class _FloatSizes(torch.nn.Module):
    """DeepSeek-OCR 2's SAM-style relative coordinates and Music Flamingo's window duration in small: sizes made
    floats (``k / q``, ``0.04 * n``) scaling tensors."""

    def forward(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q_size, k_size = q.shape[1], k.shape[1]
        q_coords = torch.arange(q_size)[:, None] * max(k_size / q_size, 1.0)
        k_coords = torch.arange(k_size)[None, :] * max(q_size / k_size, 1.0)
        relative = (q_coords - k_coords) + (k_size - 1) * max(q_size / k_size, 1.0)
        return relative, torch.round(q.sum(-1) / (0.04 * q_size))


def test_sizes_made_floats_convert_and_match_eager_at_other_sizes(monkeypatch):
    """The frontend had no rule for a size made a float ("No conversion rule found for operations: <built-in
    function truediv>"; checked below with the rewrite off); openvino-symbolic-floats computes it as a 0-d tensor."""
    from hfexport.workarounds import openvino_symbolic_floats

    torch.manual_seed(0)
    model = _FloatSizes()
    exported = OpenVINOExporter().export(model, {"q": torch.randn(2, 6), "k": torch.randn(2, 6)},
                                         OpenVINOConfig(dynamic=True))
    assert "openvino-symbolic-floats" in exported.components["model"].metadata.workarounds
    for q, k in ((6, 6), (4, 4), (11, 11)):  # (q == k: what max() of the traced ratios guards, on Dynamo too)
        inputs = {"q": torch.randn(2, q), "k": torch.randn(2, k)}
        got, want = exported(**inputs), model(**inputs)
        assert all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want, strict=True)), (q, k)

    monkeypatch.setattr(openvino_symbolic_floats, "float_sizes_as_tensors", lambda program: 0)
    with pytest.raises(Exception, match="truediv|sym_float"):
        OpenVINOExporter().export(model, {"q": torch.randn(2, 6), "k": torch.randn(2, 6)},
                                  OpenVINOConfig(dynamic=True))


class _TextMask(torch.nn.Module):
    """Grounding DINO's decoder text mask in small: a padding mask tiled over its 4 heads and 8 queries."""

    def forward(self, scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        tiled = mask[:, None, None, :].repeat(1, 4, 8, 1).to(scores.dtype)
        return (scores + tiled * torch.finfo(scores.dtype).min).softmax(-1)


def test_a_repeat_of_two_unit_dims_is_an_expand_where_the_cpu_plugin_tiles_them_wrong(monkeypatch):
    """OpenVINO's CPU plugin tiles a partly dynamic ``[?,1,1,?]`` by ``[1, 4, 8, 1]`` in the wrong order (raw opset
    ops below: when this assertion fails, the plugin is fixed and openvino-tile-unit-dims can go); Grounding DINO's
    padded text row attended to the wrong positions. The workaround broadcasts those dims instead."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    from hfexport.workarounds import openvino_tile_unit_dims

    rows = np.arange(12, dtype=np.float32).reshape(2, 1, 1, 6)
    param = ops.parameter([-1, 1, 1, -1], np.float32)
    tile = ops.tile(param, ops.constant(np.array([1, 4, 8, 1], dtype=np.int64)))
    got = ov.Core().compile_model(ov.Model([tile], [param]), "CPU")([rows])[0]
    assert not np.array_equal(got, np.tile(rows, [1, 4, 8, 1]))  # the plugin's bug, still there

    inputs = {"scores": torch.randn(2, 4, 8, 6), "mask": torch.tensor([[True, True] + [False] * 4, [False] * 6])}
    expected = _TextMask()(**inputs)
    exported = OpenVINOExporter().export(_TextMask(), inputs, OpenVINOConfig(dynamic=True))
    assert "openvino-tile-unit-dims" in exported.components["model"].metadata.workarounds
    torch.testing.assert_close(exported(**inputs), expected, rtol=0, atol=1e-6)

    monkeypatch.setattr(openvino_tile_unit_dims, "expand_unit_tiles", lambda program: 0)
    wrong = OpenVINOExporter().export(_TextMask(), inputs, OpenVINOConfig(dynamic=True))(**inputs)
    assert (wrong - expected).abs().max() > 0.1
