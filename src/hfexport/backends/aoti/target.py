"""The machine an AOTInductor package is built for, and why another machine cannot run it.

Inductor compiles a CPU package with ``-march=native`` and vector kernels for the best ISA it finds
(``torch._inductor.cpu_vec_isa.pick_vec_isa``): the shared library may use every instruction-set extension the
building CPU has, and it links this torch's C++ library. :func:`build_target` records what the code depends on (the
CPU's instruction-set flags, the vector ISA, the compiler, torch, the architecture); :func:`target_problems` says,
before any of that code is loaded, what the loading machine lacks. A CPU with *more* features runs the package; the
compiler that built it is recorded but not required where it runs (the library is already compiled).
"""

from __future__ import annotations

import functools
import platform
import re
import subprocess
from typing import Any

import torch

__all__ = ["build_target", "target_problems", "cpu_isa_flags"]

# the /proc/cpuinfo flags that name instruction-set extensions a compiler may emit under -march=native (the rest:
# power management, virtualisation, known bugs, say nothing about which instructions run)
_ISA_FLAG = re.compile(
    r"^(avx\w*|amx\w*|sse\w*|ssse3|fma\w*|f16c|bmi\d|popcnt|movbe|abm|lzcnt|adx|aes|vaes|pclmulqdq|vpclmulqdq|sha_ni|"
    r"gfni|rdrand|rdseed|cx16|xsave\w*|mmx|serialize|movdir\w*|clflushopt|clwb|prefetchw|waitpkg|"
    r"asimd\w*|sve\w*|fp|fphp|bf16|i8mm|dotprod|sm\d|crc32|atomics|vsx\w*|vxe\w*)$"
)


@functools.cache
def cpu_isa_flags() -> tuple[str, ...]:
    """This CPU's instruction-set flags (Linux ``/proc/cpuinfo``); empty where the file is not there."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8", errors="replace").read()
    except OSError:
        return ()
    match = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
    return tuple(sorted(f for f in (match.group(1).split() if match else []) if _ISA_FLAG.match(f)))


def _compiler() -> str:
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        compiler = get_cpp_compiler()
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30).stdout
        return f"{compiler}: {version.splitlines()[0].strip()}" if version else compiler
    except Exception as e:  # noqa: BLE001 - recorded for the reader, never checked
        return f"unknown ({type(e).__name__})"


def _vector_isa() -> str:
    from torch._inductor import cpu_vec_isa

    return type(cpu_vec_isa.pick_vec_isa()).__name__


def build_target(device: str = "cpu", march: str | None = None) -> dict[str, Any]:
    """What a package compiled here and now depends on (recorded in each component's metadata)."""
    return {
        "device": device,
        "machine": platform.machine(),
        "system": platform.system(),
        "torch": torch.__version__,
        "march": march or "native",
        "vector_isa": _vector_isa() if device == "cpu" else None,
        "cpu_flags": list(cpu_isa_flags()) if device == "cpu" else [],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "compiler": _compiler(),
    }


def target_problems(recorded: dict[str, Any]) -> list[str]:
    """Why this machine cannot run a package built for ``recorded`` (empty: it can). Reads nothing of the package."""
    if not recorded:
        return ["the export records no build target (not an AOTInductor export hfexport wrote): re-export it"]
    problems = []
    for key, here in (("machine", platform.machine()), ("system", platform.system())):
        if recorded.get(key) != here:
            problems.append(f"built for {key} {recorded.get(key)!r}, this is {here!r}")
    if recorded.get("torch") != torch.__version__:
        problems.append(f"built with torch {recorded.get('torch')}, this is torch {torch.__version__} (the library "
                        "links torch's C++ ABI of the version that compiled it)")
    if recorded.get("device") == "cpu" and recorded.get("march", "native") == "native":
        here = set(cpu_isa_flags())
        missing = sorted(set(recorded.get("cpu_flags") or []) - here) if here else []
        if missing:
            problems.append(f"compiled with -march=native on a CPU with {', '.join(missing)}, which this CPU lacks "
                            f"(the code may use those instructions)")
        isa = recorded.get("vector_isa")
        if isa and isa not in _valid_isas():
            problems.append(f"its vector kernels are {isa}, which this CPU does not run (it runs: "
                            f"{', '.join(_valid_isas()) or 'none'})")
    if recorded.get("device", "cpu") != "cpu" and not torch.cuda.is_available():
        problems.append(f"compiled for {recorded.get('device')}, and no such device is visible here")
    return problems


def _valid_isas() -> list[str]:
    from torch._inductor import cpu_vec_isa

    return [type(isa).__name__ for isa in cpu_vec_isa.valid_vec_isa_list()]
