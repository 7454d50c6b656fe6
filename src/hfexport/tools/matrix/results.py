"""The matrix's durable record: ``support-matrix.jsonl``, one JSON line per finished case, written as it finishes.

Lines are of three kinds: ``{"run": {...}}`` when a run starts (its command, backends, load, versions, commit),
a case row (the CSV's fields plus ``run``, the id of the run that produced it, and ``finished``, a UTC time) and
``{"run_end": ID, ...}`` when a run ends normally. A run that was interrupted has no end line; the rows it
finished stay. :func:`load` keeps the last row of each (model_type, backend, stage), so a later run replaces an
earlier one case by case, and ``hfexport matrix --resume`` skips every case already recorded. The reports
(CSV, Markdown, PNG) are regenerated from all kept rows, and :func:`describe_runs` says which run produced which.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "support-matrix.jsonl"
    >>> rec = Recorder(path, {"command": "hfexport matrix --backends dynamo"})
    >>> rec.add({"model_type": "llama", "backend": "dynamo", "stage": "export", "status": "pass"})
    >>> rows, runs = load(path)
    >>> [(r["model_type"], r["status"]) for r in rows], len(runs)
    ([('llama', 'pass')], 1)
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

__all__ = ["JSONL", "Recorder", "case_key", "load", "recorded", "describe_runs"]

JSONL = "support-matrix.jsonl"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def case_key(row: dict[str, Any]) -> tuple[str, str, str]:
    return (row["model_type"], row["backend"], row["stage"])


class Recorder:
    """Appends to ``path``: the run line now, a row per :meth:`add`, the end line at :meth:`close`.

    Each line is flushed and synced to disk before :meth:`add` returns, so a killed run loses at most the case
    that was running.
    """

    def __init__(self, path: Path, run: dict[str, Any]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.id = run.get("id") or f"{_now()}-{uuid.uuid4().hex[:6]}"  # two runs may start in one second
        self._lock = threading.Lock()
        self._count = 0
        self._write({"run": {**run, "id": self.id, "started": run.get("started") or _now()}})

    def _write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, sort_keys=False) + "\n"
        with self._lock, self.path.open("a") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def add(self, row: dict[str, Any]) -> None:
        self._count += 1
        self._write({**row, "run": self.id, "finished": _now()})

    def close(self, **fields: Any) -> None:
        self._write({"run_end": self.id, "finished": _now(), "cases": self._count, **fields})


def load(path: Path) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
    """``(rows, runs)``: the last row of each case in file order, and ``run id -> run`` (start fields, plus
    ``finished``/``load_end``/``cases`` when it ended). A line cut short by a kill is skipped."""
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    runs: dict[str, dict[str, Any]] = {}
    path = Path(path)
    if not path.exists():
        return [], runs
    with path.open() as f:
        for line in f:
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if "run" in obj and isinstance(obj["run"], dict):
                runs[obj["run"]["id"]] = dict(obj["run"])
            elif "run_end" in obj:
                runs.setdefault(obj["run_end"], {"id": obj["run_end"]}).update(
                    {k: v for k, v in obj.items() if k != "run_end"})
            elif {"model_type", "backend", "stage", "status"} <= obj.keys():
                rows.pop(case_key(obj), None)  # re-inserted last: a re-run case moves to the end
                rows[case_key(obj)] = obj
    return list(rows.values()), runs


def recorded(path: Path) -> set[tuple[str, str, str]]:
    """Keys of the cases already in ``path`` (what ``--resume`` skips)."""
    return {case_key(r) for r in load(path)[0]}


def _time(stamp: Any) -> str:
    return str(stamp).replace("T", " ").replace("Z", "")[:16] if stamp else "?"


def _load_text(load: Any) -> str:
    return " / ".join(f"{x:.2f}" for x in load) if load else "not recorded"


def describe_runs(rows: list[dict[str, Any]], runs: dict[str, dict[str, Any]], n_all: int | None = None) -> str:
    """Markdown: for each run that produced kept rows, when it ran, with which command, on which backends and how
    many architectures, the load, versions and commit; and whether it finished or was interrupted."""
    lines: list[str] = []
    for run_id, run in runs.items():
        mine = [r for r in rows if r.get("run") == run_id]
        if not mine:
            continue
        archs = len({r["model_type"] for r in mine})
        per = {}
        for r in mine:
            per.setdefault((r["backend"], r["stage"]), 0)
            per[(r["backend"], r["stage"])] += 1
        cells = ", ".join(f"{b} {s} {n}" for (b, s), n in per.items())
        if run.get("finished"):
            when = f"{_time(run.get('started'))} to {_time(run['finished'])}"
            state = f"finished ({run.get('cases', '?')} cases recorded by it)"
        else:
            when = f"started {_time(run.get('started'))}"
            state = "**interrupted or stopped before its end**: only the rows it finished are kept"
        of = f" of the {n_all} discovered" if n_all else ""
        versions = ", ".join(f"{k} {v}" for k, v in (run.get("versions") or {}).items())
        lines.append(
            f"- Run `{run_id}`, {when} UTC, {state}. Command: `{run.get('command', '?')}`. "
            f"Rows kept in this report: {len(mine)} on {archs} architecture(s){of} ({cells}). "
            f"Load average (1/5/15 min) at the start {_load_text(run.get('load_start'))}, at the end "
            f"{_load_text(run.get('load_end'))}; {run.get('jobs', '?')} job(s), nice {run.get('nice', '?')}, "
            f"{run.get('timeout', '?')} s timeout per case, process per case: {run.get('launcher', 'exec')}"
            + (f"; {versions}" if versions else "")
            + (f"; git commit {run['commit']}" if run.get("commit") else "") + "."
            + (f" {run['note']}" if run.get("note") else ""))
    return "\n".join(lines)
