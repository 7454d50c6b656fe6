"""An ExecuTorch method's memory plan is read before loading, and one that does not fit is refused by name.

``load_method`` allocates the whole plan at once; a Gemma-3 prefill planned at the default bounds (17.4 GB) was killed
by the OOM killer with no Python error. Small synthetic modules (a few seconds per export).
"""

from __future__ import annotations

import pytest
import torch

from hfexport import ExecutorchConfig, ExportedModel, UnsupportedError
from hfexport.exporter_executorch import ExecutorchExporter

pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")

from hfexport.backends.executorch import memory  # noqa: E402


class Projection(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 64)

    def forward(self, x):
        return self.proj(x).relu()


def _export(max_seq: int, model: torch.nn.Module | None = None):
    seq = torch.export.Dim("seq", min=2, max=max_seq)
    config = ExecutorchConfig(dynamic=True, dynamic_shapes={"x": {1: seq}})
    return ExecutorchExporter().export(model or Projection().eval(), {"x": torch.randn(1, 6, 8)}, config)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    torch.manual_seed(0)
    model = Projection().eval()
    exported = _export(256, model)
    folder = tmp_path_factory.mktemp("planned") / "export"
    exported.save_pretrained(folder)
    return exported, folder, model


def test_the_plan_read_from_the_file_is_executorchs_own(saved):
    exported, folder, _ = saved
    plan = exported.program.executorch_program.execution_plan[0]
    own = sum(plan.non_const_buffer_sizes[1:])  # ExecuTorch's emitter's numbers, index 0 reserved
    reloaded = ExportedModel.from_pretrained(folder)
    from_file = memory.planned_bytes(reloaded.program, "forward")
    assert from_file == own
    # the plan holds at least the output at its upper bound: 256 positions x 64 floats
    assert own >= 256 * 64 * 4


def test_the_plan_grows_with_the_dims_upper_bound(saved):
    small = memory.planned_bytes(saved[0].program, "forward")
    large = memory.planned_bytes(_export(4096).program, "forward")
    assert large >= 12 * small, (small, large)


def test_a_plan_larger_than_the_available_memory_is_refused_before_loading(saved, monkeypatch):
    _, folder, _ = saved
    planned = memory.planned_bytes(ExportedModel.from_pretrained(folder).program, "forward")
    monkeypatch.setattr(memory, "available_bytes", lambda: planned - 1)
    with pytest.raises(UnsupportedError) as info:
        ExportedModel.from_pretrained(folder)(x=torch.randn(1, 6, 8))
    message = str(info.value)
    assert f"'forward' plans {planned / 2**20:.2f} MiB" in message and "available" in message, message
    assert "x [1, 256, 8]" in message, message  # the input at its planned bound, which the advice then lowers
    assert "Dim('seq', max=" in message or "Dim('batch', max=" in message, message
    monkeypatch.setenv("HFEXPORT_SKIP_MEMORY_CHECK", "1")
    out = ExportedModel.from_pretrained(folder)(x=torch.randn(1, 6, 8))
    assert out.shape == (1, 6, 64)


def test_a_plan_that_fits_loads(saved, monkeypatch):
    _, folder, model = saved
    planned = memory.planned_bytes(ExportedModel.from_pretrained(folder).program, "forward")
    monkeypatch.setattr(memory, "available_bytes", lambda: planned + 1)
    x = torch.randn(1, 6, 8)
    with torch.no_grad():
        want = model(x)
    got = ExportedModel.from_pretrained(folder)(x=x)
    assert float((got - want).abs().max()) <= 1e-5


def test_available_memory_is_read_from_the_system():
    import platform

    if platform.system() != "Linux":
        assert memory.available_bytes() is None
        return
    with open("/proc/meminfo") as f:
        total = int(next(line for line in f if line.startswith("MemTotal:")).split()[1]) * 1024
    assert 0 < memory.available_bytes() <= total
