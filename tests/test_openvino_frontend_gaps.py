"""OpenVINO: what its PyTorch frontend does not convert as torch.export writes it, and the workarounds that convert
it (openvino-int32-item, openvino-complex-rotary on Llama-4's vision tower)."""

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
