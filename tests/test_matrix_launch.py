"""The matrix's process per case through the forkserver: each case a fresh child of a clean preloaded server, in its
own session, killed with its process group at the timeout, a crash confined to its case. Fake cases (functions of
this module, run in the forked child) keep these fast; tests/test_matrix.py runs real ones the same way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import hfexport.tools.matrix.launch as launch_module
from hfexport.tools.matrix import Case, discover, run_matrix
from hfexport.tools.matrix import scheduler
from hfexport.tools.matrix.launch import Outcome, launch

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="the forkserver start method needs POSIX fork")


def leave_a_mark(tag: str) -> dict:
    """Reads, then changes, state of a preloaded module: a child forked from a process that ran a case sees it."""
    seen = getattr(launch_module, "_mark", None)
    launch_module._mark = tag
    import torch

    return {"seen": seen, "pid": os.getpid(), "pgid": os.getpgid(0), "torch_preloaded": "torch" in sys.modules,
            "sum": float(torch.arange(4.0).sum())}


def crash(message: str) -> dict:
    print(message, file=sys.stderr, flush=True)
    os.kill(os.getpid(), signal.SIGSEGV)
    return {}


def hang_with_a_grandchild(pid_file: str) -> dict:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    Path(pid_file).write_text(str(child.pid))
    time.sleep(120)
    return {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead too, only not reaped yet
        return f.read().split(")")[-1].split()[0] != "Z"


def test_each_case_is_a_fresh_child_of_the_clean_server_in_its_own_session():
    first = launch(["first"], timeout=120, target=leave_a_mark)
    second = launch(["second"], timeout=120, target=leave_a_mark)
    assert not first["timed_out"] and first["row"] is not None, first
    a, b = first["row"], second["row"]
    assert a["seen"] is None and b["seen"] is None  # the second did not inherit what the first changed
    assert a["pid"] != b["pid"] and os.getpid() not in (a["pid"], b["pid"])
    assert a["pgid"] == a["pid"] and b["pgid"] == b["pid"]  # own session: killable as a group
    assert a["torch_preloaded"] and a["sum"] == 6.0
    assert getattr(launch_module, "_mark", None) is None  # nor did the scheduler's own process change


def test_a_crashing_case_ends_alone_with_its_signal_and_last_stderr_line():
    out = launch(["about to crash"], timeout=120, target=crash)
    assert out["row"] is None and not out["timed_out"]
    assert out["how"] == "was killed by SIGSEGV" and out["stderr_tail"] == "about to crash"
    after = launch(["after"], timeout=120, target=leave_a_mark)
    assert after["row"]["seen"] is None and after["row"]["sum"] == 6.0


def test_a_case_past_its_timeout_is_killed_with_the_processes_it_started(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    start = time.perf_counter()
    out = launch([str(pid_file)], timeout=3, target=hang_with_a_grandchild)
    assert out["timed_out"] and out["row"] is None and time.perf_counter() - start < 30
    grandchild = int(pid_file.read_text())
    deadline = time.time() + 10
    while _alive(grandchild) and time.time() < deadline:
        time.sleep(0.1)
    assert not _alive(grandchild)


@pytest.mark.parametrize("outcome,status,reason", [
    (Outcome(row=None, timed_out=True, how="was killed by SIGKILL", stderr_tail="", wall=5.0),
     "timeout", "no result within 5 s"),
    (Outcome(row=None, timed_out=False, how="was killed by SIGSEGV", stderr_tail="Fatal Python error", wall=1.0),
     "fail", "worker was killed by SIGSEGV without a result; last stderr line: Fatal Python error"),
])
def test_the_scheduler_turns_a_case_without_a_result_into_a_row_saying_why(monkeypatch, outcome, status, reason):
    arch = {a.model_type: a for a in discover(["=llama"])}["llama"]
    monkeypatch.setattr(scheduler, "launch", lambda *a, **k: outcome)
    [row] = run_matrix([Case(arch, "dynamo", "export")], timeout=5)
    assert (row["status"], row["reason"], row["wall_seconds"]) == (status, reason, outcome["wall"])


def test_an_unknown_launcher_is_refused_before_anything_runs():
    with pytest.raises(ValueError, match="unknown launcher 'thread'"):
        run_matrix([], launcher="thread")
