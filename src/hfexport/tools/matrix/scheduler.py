"""Runs matrix cases, each in its own process (:mod:`.launch`) with a wall-clock timeout.

A process per case keeps a crash (or a patch a failed export left behind) from touching the next case. Up to
``jobs`` cases run at once. When a case reports ``cannot-build``, the cases of the same architecture not started
yet get the same row without a process (the build is the same); likewise ``eager-fails`` for the same
architecture and stage, and ``unavailable`` for a backend. With a cluster (:mod:`.cluster`), each case's process
runs on a worker of the cluster instead of here; the rest is the same.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .cluster import run_case_on_worker
from .discovery import Architecture
from .launch import LAUNCHERS, kill_all, launch

__all__ = ["Case", "BACKENDS", "STAGES", "plan", "run_matrix"]

BACKENDS = ("dynamo", "onnx", "executorch", "openvino", "aoti")
STAGES = ("export", "generate")


@dataclass(frozen=True)
class Case:
    arch: Architecture
    backend: str
    stage: str

    def argv(self) -> list[str]:
        a = self.arch
        return [a.model_type, a.class_name, a.task, self.backend, self.stage]

    def row(self, **fields: Any) -> dict[str, Any]:
        row = {"model_type": self.arch.model_type, "class_name": self.arch.class_name, "task": self.arch.task,
               "backend": self.backend, "stage": self.stage, "status": "fail", "max_abs_diff": None,
               "mismatched_tokens": None, "export_seconds": None, "reason": ""}
        row.update(fields)
        return row


def plan(archs: Iterable[Architecture], backends: Iterable[str], stages: Iterable[str] = STAGES) -> list[Case]:
    """Every (architecture, backend, stage) case, grouped by architecture; ``generate`` only where generative."""
    backends, stages = list(backends), [s for s in STAGES if s in set(stages)]
    return [Case(a, b, s) for a in archs for b in backends for s in stages if s == "export" or a.generative]


def _threads(jobs: int) -> int | None:
    """Torch threads per case: the cores shared among the cases running at once (``None``: one job, torch decides)."""
    return max(1, (os.cpu_count() or 1) // jobs) if jobs > 1 else None


def _run_one(case: Case, timeout: float, launcher: str, backends: tuple[str, ...],
             threads: int | None) -> dict[str, Any]:
    out = launch(case.argv(), timeout, launcher=launcher, backends=backends, threads=threads)
    if out["timed_out"]:
        return case.row(status="timeout", reason=f"no result within {timeout:g} s", wall_seconds=out["wall"])
    if out["row"] is not None:
        return {**case.row(), **out["row"], "wall_seconds": out["wall"]}
    return case.row(status="fail", reason=f"worker {out['how']} without a result; last stderr line: "
                                          f"{out['stderr_tail']}"[:300], wall_seconds=out["wall"])


def run_matrix(cases: list[Case], jobs: int = 1, timeout: float = 300,
               on_result: Callable[[dict[str, Any], int, int], None] | None = None,
               launcher: str = "forkserver", cluster: Any = None) -> list[dict[str, Any]]:
    """Run ``cases`` and return their rows in case order; ``on_result(row, done, total)`` after each one.

    ``launcher`` says how each case's process starts (:mod:`.launch`): ``"forkserver"`` (forked from a clean
    server with torch, transformers and hfexport preloaded) or ``"exec"`` (a fresh interpreter per case).
    ``cluster`` (:class:`~.cluster.DaskCluster`): each case runs on one of its workers, ``jobs`` of them at once.
    """
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; expected one of {', '.join(LAUNCHERS)}")
    backends = tuple(dict.fromkeys(c.backend for c in cases))
    threads = _threads(jobs)
    lock = threading.Lock()
    known: dict[tuple[str, str], dict[str, Any]] = {}  # ("arch", model_type) / ("backend", name) -> shared row
    rows: list[dict[str, Any] | None] = [None] * len(cases)
    done = 0
    stopping = False

    def work(i: int) -> None:
        nonlocal done, stopping
        case = cases[i]
        with lock:
            shared = (known.get(("arch", case.arch.model_type)) or known.get(("backend", case.backend))
                      or known.get(("eager", f"{case.arch.model_type}/{case.stage}")))
        if shared is not None:
            row = case.row(status=shared["status"], reason=shared["reason"])
        elif cluster is None:
            row = _run_one(case, timeout, launcher, backends, threads)
        else:
            try:
                row = cluster.run(run_case_on_worker, _run_one, case, timeout, launcher, backends)
            except Exception as error:  # the worker died twice, or the cluster went away: the case's row says so
                row = case.row(status="fail", reason=f"cluster {cluster.address}: {type(error).__name__}: "
                                                     f"{error}"[:300])
        with lock:
            if stopping:  # killed by the finally below: not a result of the case
                return
            if row["status"] == "cannot-build":
                known[("arch", case.arch.model_type)] = row
            elif row["status"] == "eager-fails":  # the same inputs fail eagerly whatever the backend
                known[("eager", f"{case.arch.model_type}/{case.stage}")] = row
            elif row["status"] == "unavailable":
                known[("backend", case.backend)] = row
            rows[i] = row
            done += 1
            if on_result is not None:
                on_result(row, done, len(cases))

    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        list(pool.map(work, range(len(cases))))
    finally:  # interrupted (Ctrl-C, SIGTERM): no orphan worker keeps running
        with lock:
            stopping = True
        pool.shutdown(wait=False, cancel_futures=True)
        kill_all()
    return [r for r in rows if r is not None]
