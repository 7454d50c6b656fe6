"""OpenVINO: size arithmetic its PyTorch frontend has no rule for (workaround ``openvino-symbolic-ints``), here a
size squared. The ``mod`` and ``sym_min``/``sym_max`` cases are in tests/test_openvino_backend.py."""

from __future__ import annotations

import operator

import pytest
import torch

from hfexport import OpenVINOConfig
from hfexport.errors import ExportError
from hfexport.exporter_openvino import OpenVINOExporter


class _SquareRows(torch.nn.Module):
    """The first ``side ** 2`` rows, ``side`` read from a tensor (Video-LLaMA 3's tower squares the merge size it
    reads off the grid): the trace keeps ``operator.pow`` of the unbacked value, and the runtime assert over it."""

    def forward(self, x: torch.Tensor, side: torch.Tensor) -> torch.Tensor:
        s = side.item()
        torch._check(s >= 1)
        torch._check(s ** 2 <= x.shape[0])
        return x[: s ** 2] * 2


def test_a_size_squared_converts_as_a_product_and_matches_eager(without_workaround):
    x, side = torch.randn(16, 3), torch.tensor(3)
    program = torch.export.export(_SquareRows(), (x, side))
    assert operator.pow in {node.target for node in program.graph.nodes}  # the premise: pow reaches the frontend
    exported = OpenVINOExporter().export(_SquareRows(), {"x": x, "side": side}, OpenVINOConfig())
    assert "openvino-symbolic-ints" in exported.components["model"].metadata.workarounds
    for n in (1, 2, 4):
        got, want = exported(x=x, side=torch.tensor(n)), _SquareRows()(x, torch.tensor(n))
        assert got.shape == want.shape == (n * n, 3) and torch.equal(got, want)
    without_workaround("openvino-symbolic-ints")
    with pytest.raises(ExportError, match="cannot convert <built-in function pow>"):
        OpenVINOExporter().export(_SquareRows(), {"x": x, "side": side}, OpenVINOConfig())
