"""``hfexport matrix``: plan the cases, run them with progress lines, record each row as it finishes
(``support-matrix.jsonl``, :mod:`.results`) and regenerate the reports from every recorded row, with a header that
says which run produced which rows."""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from ...cli.quiet import terminal

from .cluster import connect
from .discovery import discover
from .launch import LAUNCHERS
from .report import write_reports
from .results import JSONL, Recorder, describe_runs, load, recorded
from .scheduler import BACKENDS, STAGES, plan, run_matrix

__all__ = ["add_matrix_parser", "cmd_matrix"]


def add_matrix_parser(sub: Any) -> None:
    p = sub.add_parser("matrix", help="run every tiny architecture on every backend; CSV, Markdown and PNG reports")
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), metavar="BACKEND",
                   help=f"backends to run (default: {' '.join(BACKENDS)})")
    p.add_argument("--families", nargs="+", default=None, metavar="SUBSTRING",
                   help="keep model types containing one of these substrings (=NAME: exactly NAME)")
    p.add_argument("--stages", nargs="+", default=list(STAGES), choices=list(STAGES),
                   help="export (outputs vs eager) and/or generate (greedy tokens vs eager; generative classes)")
    p.add_argument("--jobs", type=int, default=1, help="cases run at once, each in its own process (default 1)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case (default 300)")
    p.add_argument("--limit", type=int, default=None, help="only the first N architectures (quick runs)")
    p.add_argument("--out", type=Path, default=Path("docs"), help="folder of support-matrix.* (default docs/)")
    p.add_argument("--no-png", action="store_true", help="skip the heat map")
    p.add_argument("--resume", action="store_true",
                   help="skip the cases already recorded in OUT/support-matrix.jsonl (an interrupted run goes on)")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: regenerate the CSV, Markdown and PNG from OUT/support-matrix.jsonl")
    p.add_argument("--launcher", choices=list(LAUNCHERS), default="forkserver",
                   help="how each case's process starts: forked from a preloaded clean server (default) or exec "
                        "of a fresh interpreter")
    p.add_argument("--cluster", default=None, metavar="ADDRESS",
                   help="run the cases on the workers of an existing Dask cluster (its scheduler's address, "
                        "tcp://HOST:8786); --jobs defaults to the cluster's threads")
    p.set_defaults(func=cmd_matrix)


def _command(args: argparse.Namespace) -> str:
    parts = ["hfexport matrix", "--backends", *args.backends, "--stages", *args.stages, "--jobs", str(args.jobs),
             "--timeout", f"{args.timeout:g}"]
    if args.families:
        parts += ["--families", *args.families]
    if args.limit is not None:
        parts += ["--limit", str(args.limit)]
    if args.launcher != "forkserver":
        parts += ["--launcher", args.launcher]
    if args.cluster:
        parts += ["--cluster", args.cluster]
    if args.resume:
        parts.append("--resume")
    return " ".join(parts)


def _load() -> tuple[float, float, float]:
    return os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _commit() -> str | None:
    """HEAD of the checkout hfexport runs from, plus the files under src/ that differ from it (other work in
    progress changes what a case runs)."""
    root = Path(__file__).resolve().parents[4]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                              text=True, timeout=20, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, timeout=20, check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return None
    changed = sorted({line[3:].strip() for line in dirty if line.strip()})
    if not changed:
        return head
    shown = ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")
    return f"{head} with uncommitted changes in {shown}"


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("transformers", "torch"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            pass
    return out


def _intro(rows: list[dict[str, Any]], n_all: int) -> str:
    per: dict[tuple[str, str], set[str]] = {}
    for r in rows:
        per.setdefault((r["backend"], r["stage"]), set()).add(r["model_type"])
    archs = len({r["model_type"] for r in rows})
    scope = "all" if archs == n_all else f"a partial matrix: {archs} of the {n_all}"
    cols = "; ".join(f"{b} {s} on {len(m)}" for (b, s), m in per.items())
    return (f"Rows for {scope} architectures found in transformers' auto mappings. Architectures per backend and "
            f"stage: {cols}. A backend claims nothing about the architectures it was not run on (blank cells "
            "marked `not run` in the grid).\n\nRuns that produced these rows:\n")


def _write(out: Path, n_all: int, png: bool) -> list[Path]:
    rows, runs = load(out / JSONL)
    header = _intro(rows, n_all) + "\n" + describe_runs(rows, runs, n_all)
    return write_reports(rows, out, header=header, png=png)


def cmd_matrix(args: argparse.Namespace) -> int:
    everything = discover()
    if args.report_only:
        paths = _write(args.out, len(everything), not args.no_png)
        print("wrote " + ", ".join(str(p) for p in paths), file=terminal())
        return 0
    archs = discover(args.families)
    if args.limit is not None:
        archs = archs[: args.limit]
    cases = plan(archs, args.backends, args.stages)
    jsonl = args.out / JSONL
    skipped = 0
    if args.resume:
        done = recorded(jsonl)
        kept = [c for c in cases if (c.arch.model_type, c.backend, c.stage) not in done]
        skipped, cases = len(cases) - len(kept), kept
    cluster = connect(args.cluster) if args.cluster else None
    if cluster is not None and args.jobs == 1:  # (the default): as many cases as the cluster has threads
        args.jobs = cluster.slots()
    print(f"matrix: {len(archs)} architecture(s) x {len(args.backends)} backend(s): {len(cases)} case(s) to run"
          + (f", {skipped} already in {jsonl} (--resume)" if args.resume else "")
          + f", {args.jobs} job(s), {args.timeout:g} s timeout each"
          + (f", on the Dask cluster at {cluster.address}" if cluster else ""), file=terminal(), flush=True)
    recorder = Recorder(jsonl, {
        "command": _command(args), "backends": args.backends, "stages": args.stages, "architectures": len(archs),
        "of": len(everything), "cases": len(cases), "skipped": skipped, "jobs": args.jobs, "timeout": args.timeout,
        "launcher": args.launcher, "cluster": cluster.address if cluster else None, "nice": os.nice(0), "load_start": list(_load()), "versions": _versions(),
        "commit": _commit(), "machine": f"{platform.machine()}, {os.cpu_count()} CPU(s)"})

    def progress(row: dict[str, Any], done: int, total: int) -> None:
        recorder.add(row)  # on disk before the next case: an interrupted run keeps it (--resume)
        diff = "" if row.get("max_abs_diff") is None else f" diff {row['max_abs_diff']:.1e}"
        secs = "" if row.get("export_seconds") is None else f" {row['export_seconds']:.1f}s"
        why = f" — {row['reason'][:120]}" if row["status"] != "pass" and row.get("reason") else ""
        print(f"[{done}/{total}] {row['model_type']} {row['backend']} {row['stage']}: {row['status']}{diff}{secs}{why}",
              file=terminal(), flush=True)

    signal.signal(signal.SIGTERM, _stop)  # a killed run stops its workers too (run_matrix's finally)
    start = time.perf_counter()
    try:
        run_matrix(cases, jobs=args.jobs, timeout=args.timeout, on_result=progress, launcher=args.launcher,
                   cluster=cluster)
    finally:
        if cluster is not None:
            cluster.close()
    recorder.close(load_end=list(_load()), minutes=round((time.perf_counter() - start) / 60, 1))
    paths = _write(args.out, len(everything), not args.no_png)
    print("wrote " + ", ".join(str(p) for p in paths), file=terminal())
    return 0
