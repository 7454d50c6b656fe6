"""How one matrix case gets its own process: a fork of a clean preloaded server, or a fresh interpreter.

``forkserver`` (the default): a ``multiprocessing`` forkserver is started once per run with torch, transformers
and hfexport already imported (:data:`PRELOAD`, plus the backends of the run); each case is a new child forked from
that server, which never runs a case itself, so every case starts from the same clean, just-imported state without
paying the ~10 s of imports of a new interpreter. ``exec``: ``python -m hfexport.tools.matrix.worker`` per case, as
before (the reference the forkserver is measured against, and the fallback where ``fork`` is not available).

Both keep what a process per case is for: the child runs in its own session (``setsid``) and is killed with its
whole process group at the timeout; a crash (segfault, OOM kill, ``os._exit``) ends that child only and becomes a
``fail`` row with the last line the child wrote to stderr.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["LAUNCHERS", "PRELOAD", "Outcome", "launch", "kill_all"]

LAUNCHERS = ("forkserver", "exec")
PRELOAD = ("torch", "torch.export", "torch._dynamo", "transformers", "transformers.modeling_utils",
           "transformers.generation.utils", "hfexport", "hfexport.exporter", "hfexport.validation",
           "hfexport.generation", "hfexport.tools.matrix.worker", "hfexport.tools.matrix.shrink",
           "hfexport.tools.matrix.inputs")

_lock = threading.Lock()
_context: Any = None
_live: dict[int, Any] = {}  # pid -> process (Popen or multiprocessing.Process) running now


class Outcome(dict):
    """``row`` (the worker's result, or ``None``), ``timed_out``, ``how`` (how a process without a result ended),
    ``stderr_tail`` (its last non-empty stderr line) and ``wall`` (seconds from start to end)."""


def _server(backends: tuple[str, ...]) -> Any:
    global _context
    with _lock:
        if _context is None:
            ctx = multiprocessing.get_context("forkserver")
            # the backends' own modules too: ImportError (a backend not installed) is skipped by the server
            ctx.set_forkserver_preload([*PRELOAD, *(f"hfexport.backends.{b}.exporter" for b in backends),
                                        *(f"hfexport.backends.{b}.runner" for b in backends)])
            _context = ctx
        return _context


def _child(argv: list[str], result: str, log: str, threads: int | None, target: Callable[..., Any] | None) -> None:
    """The forked case: own session, stdout and stderr to ``log``, the row as JSON to ``result``."""
    os.setsid()
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from . import worker

    worker._limit_memory()
    if threads:
        import torch

        torch.set_num_threads(threads)
    row = (target or worker.run_case)(*argv)
    tmp = result + ".tmp"
    Path(tmp).write_text(json.dumps(row))
    os.replace(tmp, result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no atexit or finalizers of the preloaded modules: nothing of them is owned by this child


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # the case's own session: it and anything it started
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)  # killed before its setsid ran


def kill_all() -> None:
    """Kill every case process still running (the scheduler was interrupted)."""
    for pid in list(_live):
        _kill(pid)


def _tail(text: str) -> str:
    return next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")


def _how(code: int | None) -> str:
    if code is not None and code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


def _forked(argv: list[str], timeout: float, backends: tuple[str, ...], threads: int | None,
            target: Callable[..., Any] | None) -> Outcome:
    ctx = _server(backends)
    with tempfile.TemporaryDirectory(prefix="hfexport-matrix-") as tmp:
        result, log = os.path.join(tmp, "row.json"), os.path.join(tmp, "case.log")
        proc = ctx.Process(target=_child, args=(argv, result, log, threads, target), daemon=False)
        start = time.perf_counter()
        proc.start()
        _live[proc.pid] = proc
        try:
            proc.join(timeout)
            timed_out = proc.is_alive()
            if timed_out:
                _kill(proc.pid)
                proc.join()
        finally:
            _live.pop(proc.pid, None)
        wall = round(time.perf_counter() - start, 2)
        row = json.loads(Path(result).read_text()) if os.path.exists(result) and not timed_out else None
        stderr = Path(log).read_text(errors="replace") if os.path.exists(log) else ""
    return Outcome(row=row, timed_out=timed_out, how=_how(proc.exitcode), stderr_tail=_tail(stderr), wall=wall)


def _env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[3])  # the folder holding the hfexport package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def _exec(argv: list[str], timeout: float, threads: int | None) -> Outcome:
    cmd = [sys.executable, "-m", "hfexport.tools.matrix.worker", *argv]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(threads),
                            start_new_session=True)
    _live[proc.pid] = proc
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        _kill(proc.pid)
        out, err = proc.communicate()
        timed_out = True
    finally:
        _live.pop(proc.pid, None)
    wall = round(time.perf_counter() - start, 2)
    row = None
    for line in reversed(out.splitlines()):
        if line.startswith("{") and not timed_out:
            with contextlib.suppress(ValueError):
                row = json.loads(line)
            break
    return Outcome(row=row, timed_out=timed_out, how=_how(proc.returncode), stderr_tail=_tail(err), wall=wall)


def launch(argv: list[str], timeout: float, launcher: str = "forkserver", backends: tuple[str, ...] = (),
           threads: int | None = None, target: Callable[..., Any] | None = None) -> Outcome:
    """Run ``hfexport.tools.matrix.worker.run_case(*argv)`` in a process of its own, killed after ``timeout`` seconds.

    Args:
        argv: ``[model_type, class_name, task, backend, stage]``.
        timeout: Wall-clock seconds before the case's process group is killed.
        launcher: ``"forkserver"`` or ``"exec"`` (see the module docstring).
        backends: Backends whose modules the forkserver preloads (the first call decides, for the whole process).
        threads: Torch threads in the case (``None``: torch's default).
        target: What the forked child calls instead of ``run_case`` (an importable function returning a JSON-able
            dict; tests use it); ``exec`` runs ``run_case`` only.
    """
    if launcher == "forkserver":
        return _forked(argv, timeout, tuple(backends), threads, target)
    if target is not None and launcher == "exec":
        raise ValueError("the exec launcher runs hfexport.tools.matrix.worker only; target needs the forkserver")
    if launcher == "exec":
        return _exec(argv, timeout, threads)
    raise ValueError(f"unknown launcher {launcher!r}; expected one of {', '.join(LAUNCHERS)}")
