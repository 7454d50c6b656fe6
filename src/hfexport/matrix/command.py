"""``hfexport matrix``: plan the cases, run them with progress lines, write the reports with an honest header."""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .discovery import discover
from .report import write_csv, write_reports
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
    p.set_defaults(func=cmd_matrix)


def _header(args: argparse.Namespace, n_archs: int, n_all: int, seconds: float, load: tuple[float, ...],
            end: tuple[float, ...]) -> str:
    scope = "all" if n_archs == n_all else f"a partial run: {n_archs} of the {n_all}"
    return "\n".join([
        f"Run finished {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC after {seconds / 60:.1f} "
        f"min: {scope} architectures found in transformers' auto mappings, backends {', '.join(args.backends)}, "
        f"stages {' and '.join(args.stages)} (generate: generative classes only), {args.jobs} job(s), "
        f"{args.timeout:g} s timeout per case.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPU(s), shared; load average (1/5/15 min) "
        f"{load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the start, {end[0]:.2f} / {end[1]:.2f} / {end[2]:.2f} "
        "at the end; export seconds are wall time on it.",
        f"Command: `{_command(args)}`",
    ])


def _command(args: argparse.Namespace) -> str:
    parts = ["hfexport matrix", "--backends", *args.backends, "--stages", *args.stages, "--jobs", str(args.jobs),
             "--timeout", f"{args.timeout:g}"]
    if args.families:
        parts += ["--families", *args.families]
    if args.limit is not None:
        parts += ["--limit", str(args.limit)]
    return " ".join(parts)


def _load() -> tuple[float, float, float]:
    return os.getloadavg() if hasattr(os, "getloadavg") else (0.0, 0.0, 0.0)


def _stop(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def cmd_matrix(args: argparse.Namespace) -> int:
    everything = discover()
    archs = discover(args.families)
    if args.limit is not None:
        archs = archs[: args.limit]
    cases = plan(archs, args.backends, args.stages)
    print(f"matrix: {len(archs)} architecture(s) x {len(args.backends)} backend(s) = {len(cases)} case(s), "
          f"{args.jobs} job(s), {args.timeout:g} s timeout each", file=sys.stderr, flush=True)
    load = _load()
    start = time.perf_counter()
    partial: list[dict[str, Any]] = []

    def progress(row: dict[str, Any], done: int, total: int) -> None:
        partial.append(row)
        diff = "" if row.get("max_abs_diff") is None else f" diff {row['max_abs_diff']:.1e}"
        secs = "" if row.get("export_seconds") is None else f" {row['export_seconds']:.1f}s"
        why = f" — {row['reason'][:120]}" if row["status"] != "pass" and row.get("reason") else ""
        print(f"[{done}/{total}] {row['model_type']} {row['backend']} {row['stage']}: {row['status']}{diff}{secs}{why}",
              file=sys.stderr, flush=True)
        write_csv(partial, args.out / "support-matrix.partial.csv")  # survives an interrupted run

    signal.signal(signal.SIGTERM, _stop)  # a killed run stops its workers too (run_matrix's finally)
    rows = run_matrix(cases, jobs=args.jobs, timeout=args.timeout, on_result=progress)
    header = _header(args, len(archs), len(everything), time.perf_counter() - start, load, _load())
    paths = write_reports(rows, args.out, header=header, png=not args.no_png)
    (args.out / "support-matrix.partial.csv").unlink(missing_ok=True)
    print("wrote " + ", ".join(str(p) for p in paths), file=sys.stderr)
    return 0
