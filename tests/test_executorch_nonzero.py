"""ExecuTorch: the indices of ``nonzero``, sliced, as Music Flamingo keeps its real audio frames (workaround
executorch-nonzero-layout)."""

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
