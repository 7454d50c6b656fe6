"""OpenVINO does not convert antialiased resizes (aten._upsample_bilinear2d_aa / _bicubic2d_aa) and ONNX Runtime
computes ONNX's Resize(antialias=1) with other weights: while tracing for them, F.interpolate(antialias=True) is two
matrix products with ATen's resampling weights (workarounds/antialias_resize.py). The weights give torch's values, down- and upsampling; an export that
resizes to a size read from its input (SigLIP 2's position embeddings to each image's grid) matches eager at sizes it
was not traced with."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hfexport.workarounds.antialias_resize import _interpolate


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_the_matrix_products_give_torch_s_antialiased_resize(mode):
    resize = _interpolate(F.interpolate)
    gen = torch.Generator().manual_seed(0)
    for height, width, out_h, out_w in [(16, 16, 4, 4), (16, 16, 5, 7), (7, 9, 16, 3), (24, 10, 3, 10)]:
        x = torch.randn(2, 3, height, width, generator=gen)
        expected = F.interpolate(x, size=(out_h, out_w), mode=mode, antialias=True, align_corners=False)
        assert (F.interpolate(x, size=(out_h, out_w), mode=mode) - expected).abs().max() > 1e-2  # antialias matters
        assert (resize(x, size=(out_h, out_w), mode=mode, antialias=True) - expected).abs().max() <= 1e-5
    for factor in (0.5, 0.3, 2.0):
        x = torch.randn(1, 2, 12, 10, generator=gen)
        expected = F.interpolate(x, scale_factor=factor, mode=mode, antialias=True)
        got = resize(x, scale_factor=factor, mode=mode, antialias=True)
        assert got.shape == expected.shape and (got - expected).abs().max() <= 1e-5


class ResizedTable(torch.nn.Module):
    """A 16 x 16 table resized, antialiased, to the input's grid and added to it."""

    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.table = torch.nn.Parameter(torch.randn(1, 4, 16, 16, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        return x + F.interpolate(self.table, size=x.shape[-2:], mode=self.mode, antialias=True, align_corners=False)


@pytest.mark.parametrize("fmt,mode", [("openvino", "bilinear"), ("onnx", "bilinear"),  # (bicubic: the same
                                      ("executorch", "bicubic"),  # products; timm's ViTs resample bicubic)
                                      pytest.param("openvino", "bicubic", marks=pytest.mark.sweep)])
def test_an_export_resizes_to_a_symbolic_size_like_eager(fmt, mode):
    import hfexport

    exporter, config = {"onnx": ("OnnxExporter", "OnnxConfig"), "openvino": ("OpenVINOExporter", "OpenVINOConfig"),
                        "executorch": ("ExecutorchExporter", "ExecutorchConfig")}[fmt]
    pytest.importorskip({"onnx": "onnxscript", "openvino": "openvino", "executorch": "executorch"}[fmt],
                        reason=f"the {fmt} extra is not installed")
    model = ResizedTable(mode).eval()
    gen = torch.Generator().manual_seed(0)
    exported = getattr(hfexport, exporter)().export(model, {"x": torch.randn(2, 4, 6, 5, generator=gen)},
                                                     getattr(hfexport, config)(dynamic=True))
    (component,) = exported.components.values()
    assert f"{fmt}-antialias-resize" in component.metadata.workarounds
    for shape in [(2, 4, 6, 5), (1, 4, 9, 3)]:
        x = torch.randn(*shape, generator=gen)
        got = exported(x=x)
        got = got[0] if isinstance(got, (tuple, list)) else got
        with torch.no_grad():
            assert (got - model(x)).abs().max() <= 1e-5
