"""ExecuTorch: what its portable kernels do otherwise than torch: ``nonzero``'s indices sliced, as Music Flamingo
keeps its real audio frames (workaround executorch-nonzero-layout), and a crop written as a negative pad, RWKV's
time shift (executorch-negative-pad); a squeeze the trace kept; a slice and a view sized by reads (LFM2-VL)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch", reason="the ExecuTorch backend's own package (pip install hfexport[executorch])")

from hfexport import ExecutorchConfig, ExecutorchExporter  # noqa: E402


class _Coordinates(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx = torch.nonzero(x > 0)
        return idx[:, 1] * 10 + idx[:, 0]


def test_sliced_nonzero_indices_run_and_match_eager(monkeypatch):
    """torch traces nonzero's indices column-major and the portable kernel writes them row-major: the slice after it
    failed at run time (error 0x12, "different dim orders"; checked below with the workaround off)."""
    from hfexport.workarounds import executorch_nonzero_layout

    model, x = _Coordinates(), torch.tensor([[1.0, -1.0, 2.0], [0.0, 3.0, 4.0]])
    want = model(x)
    assert want.tolist() == [0, 20, 11, 21]
    exported = ExecutorchExporter().export(model, {"x": x}, ExecutorchConfig(dynamic=False))
    assert "executorch-nonzero-layout" in exported.components["model"].metadata.workarounds
    assert torch.equal(exported(x=x), want)

    monkeypatch.setattr(executorch_nonzero_layout, "row_major_nonzero", lambda original: original)
    unfixed = ExecutorchExporter().export(model, {"x": x}, ExecutorchConfig(dynamic=False))
    with pytest.raises(RuntimeError, match="0x12"):
        unfixed(x=x)


class _TimeShift(torch.nn.Module):
    """RWKV's time shift in small: every step one later along time, the last dropped (a pad of 1 before, -1 after)."""

    def __init__(self) -> None:
        super().__init__()
        self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shift(x) * 2 + torch.nn.functional.pad(x, (-1, 2), value=3.0)[..., :3]


def test_a_negative_pad_runs_and_matches_eager(monkeypatch):
    """The portable constant_pad_nd refused negative amounts at run time ("Padding values must be non-negative", error
    0x12; checked below with the workaround off)."""
    from hfexport.workarounds import executorch_negative_pad

    model, x = _TimeShift(), torch.randn(2, 5, 3)
    exported = ExecutorchExporter().export(model, {"x": x}, ExecutorchConfig(dynamic=False))
    assert "executorch-negative-pad" in exported.components["model"].metadata.workarounds
    assert torch.allclose(exported(x=x), model(x), atol=1e-6)

    monkeypatch.setattr(executorch_negative_pad, "crop_then_pad", lambda original: original)
    unfixed = ExecutorchExporter().export(model, {"x": x}, ExecutorchConfig(dynamic=False))
    with pytest.raises(RuntimeError, match="0x12"):
        unfixed(x=x)


class _SqueezeRows(torch.nn.Module):
    """squeeze(1) of a dim traced at 3 rows (kept: the size is symbolic), then the rows flattened into the width."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.squeeze(1).reshape(x.shape[0], -1) * 2


def test_a_squeeze_of_a_symbolic_dim_that_is_one_at_run_time_keeps_the_traced_rank(monkeypatch):
    """ExecuTorch's squeeze_copy drops at run time a dim the trace kept, and its output planned at the traced rank
    cannot take it (Kimi-K2.5's tower: error 0x12; checked below with the workaround off)."""
    from hfexport.workarounds import executorch_squeeze_symbolic

    model, rows = _SqueezeRows(), torch.export.Dim("rows", min=1, max=8)
    x3, x1 = torch.randn(2, 3, 4), torch.randn(2, 1, 4)
    assert model(x1).shape == (2, 4) and model(x3).shape == (2, 12)  # torch squeezes the 1 away, the 3 not
    config = ExecutorchConfig(dynamic=True, dynamic_shapes={"x": {1: rows}})
    exported = ExecutorchExporter().export(model, {"x": x3}, config)
    assert "executorch-squeeze-symbolic" in exported.components["model"].metadata.workarounds
    for x in (x3, x1):
        assert torch.equal(exported(x=x), model(x))

    monkeypatch.setattr(executorch_squeeze_symbolic, "squeeze_static_ones", lambda program: 0)
    unfixed = ExecutorchExporter().export(model, {"x": x3}, config)
    assert torch.equal(unfixed(x=x3), model(x3))
    with pytest.raises(RuntimeError, match="0x12"):
        unfixed(x=x1)


class _UnpadImage(torch.nn.Module):
    """LFM2-VL's image features in small: the tower's output cut to the image's patch count (a mask's sum, read from
    a tensor), laid out as its grid (read too) and two columns merged before the projector (its pixel unshuffle)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, features: torch.Tensor, mask: torch.Tensor, shapes: torch.Tensor) -> torch.Tensor:
        patches = features[0][: mask.sum(1)[0]]
        height, width = shapes[0]
        grid = patches.reshape(1, height, width, -1).reshape(1, height, width // 2, -1)
        return self.proj(grid).reshape(-1, 4)


def _image(rows: int, columns: int) -> dict[str, torch.Tensor]:
    mask = torch.zeros(1, 16, dtype=torch.long)
    mask[0, : rows * columns] = 1
    generator = torch.Generator().manual_seed(rows * columns)
    return {"features": torch.randn(1, 16, 4, generator=generator), "mask": mask,
            "shapes": torch.tensor([[rows, columns]])}


def test_a_slice_and_a_view_sized_by_reads_lower_and_match_eager():
    """A slice bound read from a tensor failed to lower ('Could not guard on data-dependent expression u56 < 0': to_edge
    traces it again through torch's Python slice decomposition; workaround executorch-slice-read-bounds), and a view
    whose sizes are other expressions of the reads than its base's ('Ne(4*u192*u196*(...), 16*u190)' in ExecuTorch's
    memory-view spec; executorch-dynamic-view-of-static-base keeps it a copy): LFM2-VL's image features. Each
    failure with its workaround off is checked in the sweep below (two more exports of ~15 and ~30 s)."""
    model, config = _UnpadImage(), ExecutorchConfig(dynamic=False)
    exported = ExecutorchExporter().export(model, _image(2, 4), config)
    assert "executorch-slice-read-bounds" in exported.components["model"].metadata.workarounds
    for rows, columns in ((2, 4), (3, 4), (3, 2)):  # the traced image, and two other patch counts and grids
        image = _image(rows, columns)
        expected = model(**image)
        assert expected.shape == (rows * columns // 2, 4)
        assert (exported(**image) - expected).abs().max() <= 1e-5


class _PackedImages(torch.nn.Module):
    """MiniCPM-V's merger in small: the tower's patches of all images packed in one sequence, each image's run sliced
    between two offsets read from its grid (``start : start + height * width``), laid out as its grid with two
    columns merged."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 4)

    def forward(self, features: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
        start, out = 0, []
        for i in range(len(sizes)):
            height, width = sizes[i]
            count = height * width
            out.append(self.proj(features[0, start:start + count].view(height, width // 2, 8)).reshape(-1, 4))
            start = start + count
        return torch.cat(out)


def _packed(grids: list[list[int]]) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(sum(h * w for h, w in grids))
    return {"features": torch.randn(1, 24, 4, generator=generator), "sizes": torch.tensor(grids)}


def test_a_slice_between_two_offsets_read_from_tensors_lowers_and_matches_eager():
    """Both bounds of the second image's slice are read from tensors; to_edge's retrace asked 'u74 < u73' of them
    (executorch-slice-read-bounds now checks the end at least the start; off-check in the sweep below): MiniCPM-V
    4.6 / 4.7 and MiniCPM-o-OCR's image features."""
    model = _PackedImages()
    exported = ExecutorchExporter().export(model, _packed([[2, 4], [4, 2]]), ExecutorchConfig(dynamic=False))
    for grids in ([[2, 4], [4, 2]], [[4, 4], [2, 2]], [[2, 2], [2, 6]]):  # the traced runs, and two other splits
        image = _packed(grids)
        expected = model(**image)
        assert expected.shape == (sum(h * w for h, w in grids) // 2, 4)
        assert (exported(**image) - expected).abs().max() <= 1e-5


@pytest.mark.sweep  # (the checks above with each workaround off: three more exports, ~60 s)
def test_a_slice_and_a_view_sized_by_reads_fail_to_lower_without_their_workarounds(monkeypatch):
    from hfexport.errors import ExportError
    from hfexport.workarounds import executorch_slice_read_bounds, executorch_view_bounds

    with monkeypatch.context() as patched:
        patched.setattr(executorch_slice_read_bounds, "declare_slice_reads_sizes", lambda program: 0)
        with pytest.raises(ExportError, match=r"data-dependent expression u\d+ < 0"):
            ExecutorchExporter().export(_UnpadImage(), _image(2, 4), ExecutorchConfig(dynamic=False))
    with monkeypatch.context() as patched:
        patched.setattr(executorch_slice_read_bounds, "assert_ordered", lambda graph, node: False)
        with pytest.raises(ExportError, match=r"data-dependent expression u\d+ < u\d+"):
            ExecutorchExporter().export(_PackedImages(), _packed([[2, 4], [4, 2]]), ExecutorchConfig(dynamic=False))

    def dynamism_only(node):
        view, base = node.meta.get("val"), node.args[0].meta.get("val")
        return isinstance(view, torch.Tensor) and isinstance(base, torch.Tensor) and \
            any(isinstance(s, torch.SymInt) for s in view.shape) != any(isinstance(s, torch.SymInt) for s in base.shape)

    monkeypatch.setattr(executorch_view_bounds, "stays_a_copy", dynamism_only)
    with pytest.raises(ExportError, match=r"data-dependent expression Ne\("):
        ExecutorchExporter().export(_UnpadImage(), _image(2, 4), ExecutorchConfig(dynamic=False))


@pytest.mark.sweep  # (MiniCPM-o-OCR's image features at the matrix's tiny sizes: two ExecuTorch exports, ~5 min)
def test_minicpm_ocr_image_features_lower_and_match_eager(monkeypatch):
    """MiniCPM-o-OCR's image features for two images (traced with the sample's values: its tower reads each image's
    grid) lower and match eager. Checked with the fix off: the length of the second image's slice, between two
    offsets read from tensors, got a symbol of its own in to_edge's first retrace and the expression ``end - start``
    in its second ('should have been constant, but got -u21 + u22': executorch-slice-read-bounds forgets the slice's
    length symbol before each retrace)."""
    from hfexport.capture.image_features import ImageFeatures
    from hfexport.errors import ExportError
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model
    from hfexport.workarounds import executorch_slice_read_bounds

    torch.manual_seed(0)
    model = build_model("minicpm_ocr", "MiniCPMOcrForConditionalGeneration")
    sample = sample_inputs(model, "minicpm_ocr", batch=2, seq=6, for_generation=True)  # (two images: packed)
    image = {k: sample[k] for k in ("pixel_values", "target_sizes")}
    features = ImageFeatures(model)
    with torch.no_grad():
        expected = features(**image)
    exported = ExecutorchExporter().export(features, image, ExecutorchConfig(dynamic=True))
    assert (exported(**image) - expected).abs().max() <= 1e-4

    monkeypatch.setattr(executorch_slice_read_bounds, "forget_slice_lengths", lambda program: 0)
    with pytest.raises(ExportError, match="should have been constant"):
        ExecutorchExporter().export(features, image, ExecutorchConfig(dynamic=True))
