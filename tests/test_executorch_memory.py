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
    assert "input 0 [1, 256, 8]" in message, message  # the input at its planned bound, which the advice lowers
    assert "Dim('seq', max=" in message or "Dim('batch', max=" in message, message
    with pytest.raises(UnsupportedError) as info:  # the export in memory: named from its program's specs
        _export(256)(x=torch.randn(1, 6, 8))
    assert "x [1, 256, 8]" in str(info.value), str(info.value)
    monkeypatch.setenv("HFEXPORT_SKIP_MEMORY_CHECK", "1")
    out = ExportedModel.from_pretrained(folder)(x=torch.randn(1, 6, 8))
    assert out.shape == (1, 6, 64)


def test_running_out_of_memory_while_the_runtime_loads_the_program_is_a_typed_error(monkeypatch):
    """The pybinding's loader can allocate a method's plan itself (a tiny Mamba's 25.8 GB prefill of the O(L^2) scan
    raised std::bad_alloc from load_program, before the plan was checked)."""
    from executorch.runtime import Runtime

    exported = _export(256)
    planned = memory.planned_bytes(exported.program, "forward")

    def bad_alloc(self, *args, **kwargs):
        raise MemoryError("std::bad_alloc")

    monkeypatch.setattr(Runtime, "load_program", bad_alloc)
    with pytest.raises(UnsupportedError, match="ran out of memory") as info:
        exported(x=torch.randn(1, 6, 8))
    assert f"'forward' plans {planned / 2**20:.2f} MiB" in str(info.value) and "Dim('seq', max=" in str(info.value)
    assert isinstance(info.value.__cause__, MemoryError)


_UNDER_A_LIMIT = """
import resource, sys, torch
from hfexport import ExportedModel, UnsupportedError
from hfexport.backends.executorch import memory, runner
import executorch.runtime
used = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmData:"))
resource.setrlimit(resource.RLIMIT_DATA, (used + (512 << 20), resource.getrlimit(resource.RLIMIT_DATA)[1]))
print("available", memory.available_bytes())
try:
    ExportedModel.from_pretrained(sys.argv[1])(x=torch.randn(1, 6, 8))
except UnsupportedError as e:
    print("refused", e)
"""


def test_a_plan_over_the_process_ulimit_is_refused_before_loading(tmp_path):
    """A plan under the machine's free memory but over the process's ``RLIMIT_DATA`` (the matrix's workers run under
    8 GiB) failed in the runtime's allocation as std::bad_alloc; it is refused before loading, by the same check."""
    import platform
    import subprocess
    import sys

    if platform.system() != "Linux":
        pytest.skip("RLIMIT_DATA and /proc/self/status are Linux's")
    exported = _export(2**22)  # the output alone: 4M positions x 64 floats = 1 GiB
    planned = memory.planned_bytes(exported.program, "forward")
    assert planned >= 2**30
    exported.save_pretrained(tmp_path / "export")
    out = subprocess.run([sys.executable, "-c", _UNDER_A_LIMIT, str(tmp_path / "export")], capture_output=True,
                         text=True, timeout=300)
    out = out.stdout + out.stderr[-3000:]
    available = int(out.split("available ")[1].split()[0])
    assert 0 < available <= 512 << 20, out
    # refused by the check as the file loads (the runtime's load_program allocates the plan: std::bad_alloc, which
    # was reported as a corrupt or tampered file)
    assert f"refused the ExecuTorch method 'forward' plans {planned / 2**30:.2f} GiB" in out, out
    assert "ran out of memory" not in out and "tampered" not in out, out


@pytest.mark.sweep  # 32 s; the default suite took 35 s of new generate and conversion tests (issue 22)
def test_a_mamba_prefill_plans_its_scan_in_chunks_not_its_length_squared():
    """The selective scan's closed form (workaround mamba-symbolic-scan) held [batch, d, L, L, n] weights: planned at
    ExecuTorch's bounds (batch 8 x 512 steps) the matrix's tiny Mamba prefill took 25.8 GB and failed to load."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    model = build_model("mamba", "MambaForCausalLM")
    inputs = sample_inputs(model, "mamba")
    exported = ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=True))
    assert "mamba-symbolic-scan" in exported.components["model"].metadata.workarounds
    assert memory.planned_bytes(exported.program, "forward") < 2**30  # (0.94 GB at those bounds)
    longer = sample_inputs(model, "mamba", seq=40)  # past two chunks of the scan
    with torch.no_grad():
        want = model(**longer).logits
    assert (exported(**longer).logits - want).abs().max() <= 1e-3


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
