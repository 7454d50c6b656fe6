"""Tensor.scatter_reduce, which OpenVINO does not convert and ExecuTorch's runtime has no kernel for, traced as a
masked reduction over each position's sources while exporting to them (workarounds/scatter_reduce.py): torch's values
for every reduction, with and without ``self``, integers included, and exports that match eager (TAPAS's per-cell
means and maxima)."""

from __future__ import annotations

import pytest
import torch

from hfexport.workarounds.scatter_reduce import scatter_reduce_by_mask


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_the_mask_gives_torch_s_values(reduce, include_self):
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.int64):
        for shape, dim in (((5,), 0), ((3, 6), 1), ((4, 3), 0), ((4, 3), -2)):
            sources = list(shape)
            sources[dim] = 7  # (some positions receive no source: include_self=False keeps self there)
            make = (lambda *s: torch.randn(*s, generator=gen)) if dtype.is_floating_point else \
                (lambda *s: torch.randint(-5, 5, s, generator=gen))
            base, src = make(*shape), make(*sources)
            index = torch.randint(0, shape[dim], sources, generator=gen)
            expected = base.scatter_reduce(dim, index, src, reduce, include_self=include_self)
            got = scatter_reduce_by_mask(base, dim, index, src, reduce, include_self)
            assert got.dtype == expected.dtype
            assert torch.allclose(got.float(), expected.float(), atol=1e-5), (dtype, shape, dim)


class SegmentMeanAndMax(torch.nn.Module):
    """TAPAS's segment reductions: the mean and the maximum of each segment's values (empty segments stay 0)."""

    def forward(self, values, segments):
        zeros = torch.zeros(6, dtype=values.dtype)
        means = zeros.scatter_reduce(0, segments, values, "mean", include_self=False)
        maxima = zeros.scatter_reduce(0, segments, values, "amax", include_self=False)
        return means, maxima


@pytest.mark.parametrize("fmt", ["openvino", "executorch"])
def test_an_export_with_scatter_reduce_matches_eager(fmt):
    import hfexport

    pytest.importorskip(fmt, reason=f"the {fmt} extra is not installed")
    exporter, config = {"openvino": ("OpenVINOExporter", "OpenVINOConfig"),
                        "executorch": ("ExecutorchExporter", "ExecutorchConfig")}[fmt]
    gen = torch.Generator().manual_seed(0)
    values, segments = torch.randn(10, generator=gen), torch.tensor([0, 0, 1, 3, 3, 3, 1, 4, 0, 1])
    exported = getattr(hfexport, exporter)().export(SegmentMeanAndMax(), {"values": values, "segments": segments},
                                                     getattr(hfexport, config)(dynamic=False))
    (component,) = exported.components.values()
    assert f"{fmt}-scatter-reduce" in component.metadata.workarounds
    other = torch.tensor([5, 5, 2, 2, 0, 0, 0, 4, 4, 1])  # (segment 3 empty now)
    for got, expected in zip(exported(values=values, segments=other), SegmentMeanAndMax()(values, other), strict=True):
        assert torch.allclose(got, expected, atol=1e-6)
