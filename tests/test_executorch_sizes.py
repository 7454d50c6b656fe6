"""ExecuTorch and the sizes of a dynamic program: what its runtime computes of them and what its planner reserves.

- ``(-n) % block`` (padding to a multiple of a block): ExecuTorch's runtime kernel for a size's ``%`` takes C's
  remainder, negative for a negative ``n`` (workaround executorch-size-mod-sign rewrites it as ``a - (a // b) * b``).
- A memory view whose upper bound is evaluated larger than its base's: the planner reserves the base's bytes and the
  runtime refuses to load the method, error 0x21 (workaround executorch-view-bounds grows the base).
Both stopped LongT5 and Qwen2.5-VL's dynamic exports (their generate rows, in the sweep here).
- A layout whose strides hold a data-dependent size: ``to_executorch`` guards on their order (workaround
  executorch-unbacked-stride-order; Idefics2/3, Granite Docling, ModernVBERT).
- An int32 index of ``scatter_add``: the edge verifier takes int64 only (workaround executorch-int32-index;
  GLM-5-Next).
"""

from __future__ import annotations

import importlib

import pytest
import torch

pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")

from hfexport import ExecutorchConfig  # noqa: E402
from hfexport.exporter_executorch import ExecutorchExporter  # noqa: E402


class PadToBlocks(torch.nn.Module):
    """Pads the sequence to a multiple of 4, as a block-local attention does."""

    def forward(self, x):
        return torch.nn.functional.pad(x, (0, 0, 0, (-x.shape[1]) % 4)) * 2


def test_a_size_modulo_follows_pythons_sign_rule(without_workaround):
    x = torch.randn(2, 6, 3)
    exported = ExecutorchExporter().export(PadToBlocks(), {"x": x}, ExecutorchConfig(dynamic=True))
    assert "executorch-size-mod-sign" in exported.components["model"].metadata.workarounds
    for length in (6, 5, 8, 9):
        other = torch.randn(2, length, 3)
        expected = PadToBlocks()(other)
        got = exported(x=other)
        assert got.shape == expected.shape and torch.equal(got, expected), length

    without_workaround("executorch-size-mod-sign")  # the premise: the runtime's own % pads by -2
    plain = ExecutorchExporter().export(PadToBlocks(), {"x": x}, ExecutorchConfig(dynamic=True))
    with pytest.raises(RuntimeError, match="0x12"):
        plain(x=x)


def test_a_view_planned_larger_than_its_base_gets_a_base_as_large():
    from executorch.exir.passes.replace_view_copy_with_view_pass import _VIEW_OP, _ViewSpec
    from executorch.exir.tensor import TensorSpec

    from hfexport.workarounds.executorch_view_bounds import fit_bases_to_views

    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    base_node = graph.call_function(torch.ops.aten.mul.Tensor, (x, x))
    base = TensorSpec.from_tensor(torch.empty(32, 4, 64))
    base_node.meta["spec"] = base
    views = []
    for shape in ([512, 64], [8, 4, 4, 64]):  # (the first is larger once the bounds are evaluated)
        node = graph.call_function(_VIEW_OP, (base_node, shape))
        node.meta["spec"] = _ViewSpec(base, [32 * 4 * 64 // 64, 64] if shape[0] == 512 else shape)
        views.append(node)
    graph.output(views)
    module = torch.fx.GraphModule(torch.nn.Module(), graph)
    stride = list(base.stride)
    assert fit_bases_to_views(module) == 0  # every view fits its base

    views[0].meta["spec"].shape = [512, 64]  # what evaluating a looser expression's upper bound gives
    assert views[0].meta["spec"].nbytes() > base.nbytes()
    assert fit_bases_to_views(module) == 1
    assert base.nbytes() >= views[0].meta["spec"].nbytes() and list(base.shape[1:]) == [4, 64]
    assert base.shape[0] == 512 * 64 // (4 * 64) and list(base.stride) == stride  # leading dim only


@pytest.mark.sweep
@pytest.mark.parametrize("model_type", ["longt5", "qwen2_5_vl"])
def test_a_dynamic_export_that_pads_to_blocks_generates_like_eager(model_type):
    from hfexport.tools.matrix.discovery import discover
    from hfexport.tools.matrix.worker import run_case

    (arch,) = discover([f"={model_type}"])
    result = run_case(arch.model_type, arch.class_name, arch.task, "executorch", "generate")
    assert result["status"] == "pass" and result["mismatched_tokens"] == 0, result["reason"]


class ImageAndText(torch.nn.Module):
    def forward(self, pixel_values, input_ids, past_keys, pixel_values_videos, encoder_outputs_last_hidden_state):
        return (pixel_values.mean((1, 2, 3))[:, None] + input_ids.float().mean(1, keepdim=True), past_keys * 2,
                pixel_values_videos * 2, encoder_outputs_last_hidden_state)


def test_an_images_height_and_width_are_planned_at_the_traced_size_and_a_cache_length_is_not():
    """ExecuTorch plans every tensor at its bounds: 512 x 512 images for a tiny tower traced at 32 x 32 planned
    7 GiB (Aria's generate); a video's frames count as a batch; a cache's rank-4 length keeps the length rule. An
    image encoder's feature map that a decode step takes and returns (PP-FormulaNet's, which planned 4 GiB at 512
    per dim) follows its image."""
    from torch.export import Dim

    from hfexport.backends.executorch.bounds import BATCH_FLOOR, LENGTH_FLOOR, cap_dynamic_dims

    inputs = {"pixel_values": torch.randn(2, 3, 32, 24), "input_ids": torch.ones(2, 7, dtype=torch.long),
              "past_keys": torch.randn(2, 4, 5, 8), "pixel_values_videos": torch.randn(2, 3, 3, 16, 16),
              "encoder_outputs_last_hidden_state": torch.randn(2, 64, 4, 3)}
    auto = Dim.AUTO
    program = torch.export.export(ImageAndText(), (), inputs, dynamic_shapes={
        "pixel_values": {0: auto, 2: auto, 3: auto}, "input_ids": {0: auto, 1: auto}, "past_keys": {0: auto, 2: auto},
        "pixel_values_videos": {0: auto, 1: auto, 3: auto, 4: auto},
        "encoder_outputs_last_hidden_state": {0: auto, 1: auto, 2: auto, 3: auto}})
    caps = cap_dynamic_dims(program)
    shapes = {n.name: n.meta["val"].shape for n in program.graph.nodes if n.op == "placeholder"}
    cap = {name: [caps.get(str(d.node.expr)) if isinstance(d, torch.SymInt) else d for d in shape]
           for name, shape in shapes.items()}
    assert cap["pixel_values"] == [BATCH_FLOOR, 3, 32, 24]
    assert cap["input_ids"] == [BATCH_FLOOR, LENGTH_FLOOR]
    assert cap["past_keys"] == [BATCH_FLOOR, 4, LENGTH_FLOOR, 8]
    assert cap["pixel_values_videos"] == [BATCH_FLOOR, 4 * 3, 3, 16, 16]  # frames as a batch, not 512 of them
    assert cap["encoder_outputs_last_hidden_state"] == [BATCH_FLOOR, 4 * 64, 4, 3]


class KeepRows(torch.nn.Module):
    """Keeps the rows a mask selects (an image-text model's real images), then puts their count inside the layout."""

    def forward(self, x, keep):
        rows = x[keep]  # [u, 4, 8], u data-dependent
        return (rows.transpose(0, 1).contiguous() * 2).sum(1)  # through [4, u, 8]: strides (8u, 8, 1)


def test_a_layout_whose_strides_hold_a_data_dependent_size_gets_a_dim_order(without_workaround):
    x = torch.randn(3, 4, 8)
    inputs = {"x": x, "keep": torch.tensor([True, False, True])}
    exported = ExecutorchExporter().export(KeepRows(), inputs, ExecutorchConfig(dynamic=True))
    assert "executorch-unbacked-stride-order" in exported.components["model"].metadata.workarounds
    for keep in ([True, False, True], [True, True, True], [False, True, False]):
        keep = torch.tensor(keep)
        torch.testing.assert_close(exported(x=x, keep=keep), KeepRows()(x, keep), rtol=0, atol=1e-6)

    without_workaround("executorch-unbacked-stride-order")  # the premise: to_executorch guards on 8*u < 8
    with pytest.raises(Exception, match="data-dependent"):
        ExecutorchExporter().export(KeepRows(), inputs, ExecutorchConfig(dynamic=True))


class CountPicks(torch.nn.Module):
    """Counts how often each position is picked, from int32 indices (GLM-5-Next's top-k attention mask)."""

    def forward(self, picks):
        counts = torch.zeros(picks.shape[0], 16, dtype=torch.int32)
        counts.scatter_add_(-1, picks, torch.ones_like(picks))
        return counts * 3


def test_an_int32_index_of_scatter_add_is_taken(without_workaround):
    picks = torch.randint(0, 16, (2, 5), dtype=torch.int32)
    exported = ExecutorchExporter().export(CountPicks(), {"picks": picks}, ExecutorchConfig(dynamic=True))
    assert "executorch-int32-index" in exported.components["model"].metadata.workarounds
    other = torch.randint(0, 16, (3, 7), dtype=torch.int32)
    assert torch.equal(exported(picks=other), CountPicks()(other))

    without_workaround("executorch-int32-index")  # the premise: the edge verifier takes int64 indices only
    with pytest.raises(Exception, match="mismatched dtypes"):
        ExecutorchExporter().export(CountPicks(), {"picks": picks}, ExecutorchConfig(dynamic=True))


class ResizeTo(torch.nn.Module):
    """Siglip 2's position table in small: resampled to a grid whose sides are read from a tensor."""

    def forward(self, x, grid):
        rows, cols = grid[0].item(), grid[1].item()
        return torch.nn.functional.interpolate(x, size=(rows, cols), mode="bilinear") * 2


def test_a_size_read_from_a_static_input_is_planned_at_a_cap(monkeypatch):
    """With static inputs the program had no dynamic dim, so the sizes read from a tensor kept no upper bound and the
    planner refused them ("Cannot evaluate a finite upper bound for symbolic expression u..": Siglip 2, SAM 3,
    V-JEPA 2, Mimi); each is capped like a length."""
    from hfexport.backends.executorch import bounds

    model = ResizeTo()
    inputs = {"x": torch.randn(1, 3, 4, 4), "grid": torch.tensor([6, 5])}
    exported = ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=False))
    assert torch.allclose(exported(**inputs), model(**inputs), atol=1e-5)
    other = {"x": inputs["x"], "grid": torch.tensor([3, 9])}  # another grid within the cap runs too
    assert torch.allclose(exported(**other), model(**other), atol=1e-5)

    # without the shape environment found through the reads, nothing is capped: the planner met "Cannot evaluate
    # a finite upper bound for symbolic expression u..", a full export said so before the fix
    program = torch.export.export(model, (), inputs)
    monkeypatch.setattr(bounds, "_read_sizes_env", lambda program: None)
    assert bounds.cap_dynamic_dims(program) == {}
    monkeypatch.undo()
    caps = bounds.cap_dynamic_dims(torch.export.export(model, (), inputs))
    assert sorted(caps.values()) == [4 * 5, 4 * 6]  # 4 x the sizes the sample reads


class MergeByGrid(torch.nn.Module):
    """LFM3-VL's and Video-LLaMA 3's towers in small: static patches merged 2 x 2 by a grid read from a tensor."""

    def forward(self, x, grid):
        t, h, w = grid[0].tolist()
        y = x.view(t, h // 2, 2, w // 2, 2, x.shape[-1]).permute(0, 1, 3, 2, 4, 5)
        return y.reshape(t * (h // 2) * (w // 2), 4 * x.shape[-1]) * 2


@pytest.mark.parametrize("unfixed, error", [
    (None, None),
    ("hfexport.workarounds.executorch_transposed_views._may_be_contiguous", "data-dependent expression Eq"),
    ("hfexport.workarounds.executorch_view_bounds.stays_a_copy", "shape_dynamism=1"),
])
def test_patches_merged_by_a_grid_read_from_a_tensor_lower_and_match_eager(monkeypatch, unfixed, error):
    """Each lowering step that met the grid's data-dependent sizes, checked with its fix off: the transposed-view
    copy asked the transpose whether it is contiguous (a guard), the view spec refused a dynamic view of a static
    base. (The _ViewSpec's own stride order, executorch-unbacked-stride-order's new caller, needs a dynamic base:
    LFM3-VL's tower in the matrix.)"""
    model, x = MergeByGrid(), torch.randn(16, 8)
    if unfixed is None:
        exported = ExecutorchExporter().export(model, {"x": x, "grid": torch.tensor([[1, 4, 4]])},
                                               ExecutorchConfig(dynamic=False))
        for grid in ([[1, 4, 4]], [[1, 2, 8]]):  # the traced grid and another one of the same patches
            grid = torch.tensor(grid)
            assert torch.equal(exported(x=x, grid=grid), model(x, grid)), grid
        return
    module, name = unfixed.rsplit(".", 1)
    monkeypatch.setattr(importlib.import_module(module), name,
                        (lambda v: bool(v.is_contiguous())) if name == "_may_be_contiguous" else (lambda node: False))
    with pytest.raises(Exception, match=error):
        ExecutorchExporter().export(model, {"x": x, "grid": torch.tensor([[1, 4, 4]])}, ExecutorchConfig(dynamic=False))


class RowsByCounts(torch.nn.Module):
    """HunYuan-VL's and Muse Spark's towers in small: each image's rows repeated by counts read from a tensor."""

    def forward(self, x, counts):
        return torch.repeat_interleave(x, counts, dim=0) * 2


def test_rows_repeated_by_a_tensor_of_counts_lower_and_match_eager(monkeypatch):
    """aten.repeat_interleave.Tensor is not core ATen and torch has no decomposition of it: to_edge refused it
    (checked below with the decomposition off); executorch-repeat-interleave-tensor compares positions with the
    counts' cumulative sums."""
    from hfexport.workarounds import executorch_repeat_interleave

    model, x = RowsByCounts(), torch.randn(3, 4)
    counts = torch.tensor([2, 0, 3])
    torch.testing.assert_close(executorch_repeat_interleave.repeat_rows(x, counts, 0), model(x, counts) / 2)
    exported = ExecutorchExporter().export(model, {"x": x, "counts": counts}, ExecutorchConfig(dynamic=False))
    for other in (counts, torch.tensor([1, 4, 1])):  # the traced counts and others of another total
        assert torch.equal(exported(x=x, counts=other), model(x, other)), other

    monkeypatch.setattr(executorch_repeat_interleave, "decompose_repeat_interleave", lambda program: program)
    with pytest.raises(Exception, match="repeat_interleave.Tensor is not in Core ATen"):
        ExecutorchExporter().export(model, {"x": x, "counts": counts}, ExecutorchConfig(dynamic=False))


class SquareOfARead(torch.nn.Module):
    """Video-LLaMA 3's tower in small: a size read from a tensor, squared (its merge size)."""

    def forward(self, x, side):
        n = side.item()
        torch._check(n >= 1)
        torch._check(n ** 2 <= x.shape[0])
        return x[: n ** 2] * 2


def test_a_size_squared_lowers_and_matches_eager(monkeypatch):
    """ExecuTorch has no prim op for operator.pow of sizes: "invalid target for call_function <built-in function
    pow>" (checked below with the rewrite off); executorch-size-pow multiplies instead."""
    from hfexport.workarounds import executorch_sym_mod

    model, x = SquareOfARead(), torch.randn(10, 3)
    exported = ExecutorchExporter().export(model, {"x": x, "side": torch.tensor(3)}, ExecutorchConfig(dynamic=False))
    for side in (3, 2):
        assert torch.equal(exported(x=x, side=torch.tensor(side)), model(x, torch.tensor(side))), side

    monkeypatch.setattr(executorch_sym_mod, "sym_pow_as_products", lambda program: 0)
    with pytest.raises(Exception, match="pow"):
        ExecutorchExporter().export(model, {"x": x, "side": torch.tensor(3)}, ExecutorchConfig(dynamic=False))
