"""torch.cummax / torch.cummin, which ONNX, OpenVINO and ExecuTorch do not convert, traced as a masked maximum
(minimum) over each position's prefix while exporting to them (workarounds/cumulative_extrema.py): the same values
and indices as torch, ties included, and an export that matches eager (Grounding DINO's previous / next special
token scan)."""

from __future__ import annotations

import pytest
import torch

from hfexport.workarounds.cumulative_extrema import cumulative_by_prefix_mask


@pytest.mark.parametrize("largest", [True, False])
def test_the_prefix_mask_gives_torch_s_values_and_indices_ties_included(largest):
    reference = torch.cummax if largest else torch.cummin
    gen = torch.Generator().manual_seed(0)
    for x in (torch.randint(-2, 2, (2, 7, 5), generator=gen), torch.randn(3, 9, generator=gen),
              torch.tensor([[1, 1, 0, 2, 2, 1]]), torch.tensor(3.0)):
        for dim in range(-max(x.dim(), 1), max(x.dim(), 1)):
            expected, got = reference(x, dim), cumulative_by_prefix_mask(x, dim, largest)
            assert torch.equal(got.values, expected.values) and torch.equal(got.indices, expected.indices)
            assert got.values.dtype == x.dtype and got.indices.dtype == torch.long


class SpecialTokenScan(torch.nn.Module):
    """Each token's previous and next special token, as Grounding DINO finds them, and a running maximum of floats."""

    def forward(self, ids, x):
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        special = ids == 0
        previous = torch.cummax(torch.where(special, positions, -1), dim=1)[0]
        following = torch.flip(torch.cummin(torch.flip(torch.where(special, positions, ids.shape[1]), dims=[1]),
                                            dim=1)[0], dims=[1])
        running = x.cummax(dim=-1)
        return previous, following, running.values, running.indices


@pytest.mark.parametrize("fmt", ["onnx", "openvino"])
def test_an_export_with_cummax_and_cummin_matches_eager(fmt):
    import hfexport

    exporter, config = {"onnx": ("OnnxExporter", "OnnxConfig"), "openvino": ("OpenVINOExporter", "OpenVINOConfig")}[fmt]
    pytest.importorskip({"onnx": "onnxscript", "openvino": "openvino"}[fmt], reason=f"{fmt} extra not installed")
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 4, (2, 9), generator=gen)
    x = torch.randint(0, 3, (2, 9), generator=gen).float()  # ties
    exported = getattr(hfexport, exporter)().export(SpecialTokenScan(), {"ids": ids, "x": x},
                                                     getattr(hfexport, config)(dynamic=True))
    (component,) = exported.components.values()
    assert f"{fmt}-cummax-cummin" in component.metadata.workarounds
    ids2, x2 = torch.randint(0, 4, (3, 12), generator=gen), torch.randint(0, 3, (3, 12), generator=gen).float()
    for got, expected in zip(exported(ids=ids2, x=x2), SpecialTokenScan()(ids2, x2), strict=True):
        assert torch.equal(got, expected)
