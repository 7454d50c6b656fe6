"""``hfexport env``: what is installed, what was tested, and which backends can run here.

Versions come from package metadata (:mod:`importlib.metadata`); no backend package is imported, so the report is
fast and works even when an installed package is broken.

Example:
    >>> from hfexport.cli.env import environment_report, format_report
    >>> report = environment_report()
    >>> report["dependencies"]["torch"]["tested"]
    '2.13.0'
    >>> print(format_report(report))  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
from collections.abc import Mapping, Sequence
from importlib import metadata

from packaging.version import InvalidVersion, Version

from hfexport._versions import EXTRAS, TESTED, pip_line

__all__ = ["environment_report", "format_report", "main_env"]

_CORE = ("torch", "transformers")
_CPU_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_bf16",
              "amx_int8", "asimd", "sve", "sve2", "bf16", "i8mm")
"""CPU features that change which kernels (and, for OpenVINO, which default precision) a backend uses."""


def _installed_version(dist: str) -> str | None:
    """The installed version of a distribution, or None when it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _same_release(installed: str, tested: str) -> bool:
    """True when the versions match, ignoring a local label (torch's ``2.13.0+cpu`` is the tested ``2.13.0``)."""
    try:
        return Version(installed).public == Version(tested).public
    except InvalidVersion:
        return installed == tested


def _cpu() -> dict[str, object]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "Hardware") and value.strip():
                    model = value.strip()
                elif key in ("flags", "Features"):
                    flags.update(value.split())
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"model": model, "logical_cores": os.cpu_count(), "usable_cores": usable,
            "flags": [f for f in _CPU_FLAGS if f in flags]}


def _backend_shipped(name: str) -> bool:
    """Whether this hfexport release has the backend package (found without importing it or its runtime)."""
    if name not in ("dynamo", "onnx", "executorch", "openvino", "aoti"):
        return True
    import importlib.util

    try:
        return importlib.util.find_spec(f"hfexport.backends.{name}") is not None
    except ModuleNotFoundError:
        return False


def environment_report(
    tested: Mapping[str, str] | None = None, extras: Mapping[str, Sequence[str]] | None = None
) -> dict:
    """Collects the environment: Python, platform, CPU, each dependency and each backend.

    Args:
        tested: the pins to compare against; defaults to :data:`hfexport._versions.TESTED`.
        extras: the distributions each backend needs; defaults to :data:`hfexport._versions.EXTRAS`.

    Returns:
        A JSON-serialisable dict with keys ``hfexport`` (version or None), ``python``, ``platform``, ``cpu``,
        ``dependencies`` (name -> ``{"installed", "tested", "status"}``, status one of ``"ok"``, ``"drift"``,
        ``"missing"``) and ``backends`` (name -> ``{"usable", "requires", "missing", "drift", "pip"}``, where
        ``pip`` installs the missing distributions at their tested versions, ``""`` when nothing is missing).
    """
    tested = dict(TESTED if tested is None else tested)
    extras = {k: list(v) for k, v in (EXTRAS if extras is None else extras).items()}
    dependencies = {}
    for name in dict.fromkeys([*tested, *(d for ds in extras.values() for d in ds)]):
        installed, pin = _installed_version(name), tested.get(name)
        if installed is None:
            status = "missing"
        elif pin is None or _same_release(installed, pin):
            status = "ok"
        else:
            status = "drift"
        dependencies[name] = {"installed": installed, "tested": pin, "status": status}
    backends = {}
    for backend, needs in extras.items():
        missing = [d for d in needs if dependencies[d]["status"] == "missing"]
        shipped = _backend_shipped(backend)
        # AOTInductor compiles C++ at export: a compiler is what it needs beyond the core packages
        no_compiler = backend == "aoti" and not any(shutil.which(c) for c in ("g++", "c++", "clang++"))
        backends[backend] = {
            "usable": not missing and shipped and not no_compiler,
            "implemented": shipped,
            "requires": needs,
            "missing": missing,
            "drift": [d for d in needs if dependencies[d]["status"] == "drift"],
            "pip": pip_line(missing, tested=tested) if missing else "",
            **({"note": "needs a C++ compiler on PATH to export (e.g. apt install g++)"} if no_compiler else {}),
        }
    return {
        "hfexport": _installed_version("hfexport"),
        "python": {"version": platform.python_version(), "implementation": platform.python_implementation(),
                   "executable": sys.executable},
        "platform": {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
                     "platform": platform.platform()},
        "cpu": _cpu(),
        "dependencies": dependencies,
        "backends": backends,
    }


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def fmt(row: Sequence[str]) -> str:
        return "  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip()

    return [fmt(header), fmt(["-" * w for w in widths]), *(fmt(r) for r in rows)]


def format_report(report: Mapping) -> str:
    """Renders :func:`environment_report`'s dict as plain-text tables.

    Args:
        report: the dict returned by :func:`environment_report` (or read back from its JSON).

    Returns:
        A header (hfexport, Python, platform, CPU), a dependency table (installed, tested, status) and a backend
        table (usable, and what to run when it is not).
    """
    py, plat, cpu = report["python"], report["platform"], report["cpu"]
    lines = [
        f"hfexport  {report['hfexport'] or 'not installed (running from a source tree)'}",
        f"python    {py['version']} ({py['implementation']}) {py['executable']}",
        f"platform  {plat['platform']}",
        f"cpu       {cpu['model']}, {cpu['usable_cores']} of {cpu['logical_cores']} cores usable"
        + (f"; {' '.join(cpu['flags'])}" if cpu["flags"] else ""),
        "",
    ]
    deps = report["dependencies"]
    lines += _table(
        ["dependency", "installed", "tested", "status"],
        [[n, d["installed"] or "-", d["tested"] or "-", d["status"]] for n, d in deps.items()],
    )
    lines.append("")
    rows = []
    for name, b in report["backends"].items():
        if not b.get("implemented", True):
            note = "not in this hfexport release yet"
        elif not b["usable"]:
            note = b["pip"] or b.get("note", "")
        elif b["drift"]:
            note = "untested versions: " + ", ".join(f"{d} {deps[d]['installed']}" for d in b["drift"])
        else:
            note = ""
        rows.append([name, "yes" if b["usable"] else "no", note])
    lines += _table(["backend", "usable", "to fix"], rows)
    return "\n".join(lines)


def main_env(json_out: bool = False) -> int:
    """Prints the environment report (the ``hfexport env`` command).

    Args:
        json_out: print JSON instead of the tables.

    Returns:
        The exit status: 0, or 1 when a core dependency (torch, transformers) is missing.
    """
    report = environment_report()
    print(json.dumps(report, indent=2) if json_out else format_report(report))
    core_missing = [n for n in _CORE if report["dependencies"].get(n, {}).get("status") == "missing"]
    return 1 if core_missing else 0
