"""The memory an ExecuTorch method plans, checked against what this machine has before the runtime allocates it.

ExecuTorch plans every activation at its upper bound, and ``load_method`` allocates the whole plan at once. A program
planned at the default bounds of :mod:`.bounds` for a large vocabulary (Gemma-3's 262144 logits per position, batch 8
x 2000 positions) plans 17.4 GB: the load was killed by the OOM killer with no Python error. So before loading a
method we read its plan (``ExecutionPlan.non_const_buffer_sizes`` of the program flatbuffer, summed) and refuse, with
the inputs' planned bounds and the ``Dim(max=...)`` to lower them, what does not fit in the memory available now
(``MemAvailable``, and the cgroup's limit where it is lower).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

from ...errors import UnsupportedError

__all__ = ["planned_bytes", "available_bytes", "check_planned_memory", "out_of_memory_at_load"]

_PLAN_BUFFER_SIZES = 8  # ExecutionPlan.non_const_buffer_sizes (schema/program.fbs); index 0 is reserved


def planned_bytes(program: Any, method: str) -> int | None:
    """Bytes ``method`` plans: from an ``ExecutorchProgramManager``'s program, or from the ``.pte`` a loaded
    ``executorch.runtime.Program`` came from (``hfexport_path``); ``None`` where neither is at hand."""
    plans = getattr(getattr(program, "executorch_program", None), "execution_plan", None)
    if plans is not None:
        return next((sum(p.non_const_buffer_sizes[1:]) for p in plans if p.name == method), None)
    path = getattr(program, "hfexport_path", None)
    return _planned_in_file(Path(path), method) if path else None


def _planned_in_file(path: Path, method: str) -> int | None:
    from .safety import _Flatbuffer, _header

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        _, program_size, _, _ = _header(buf, "ET##", b"eh00", "<IQQQ")  # the file passed check_program
        fb = _Flatbuffer(buf, 0, program_size)
        for plan in fb.tables(fb.root(), 1):
            if fb.string(plan, 0) == method:
                start, count = fb.vector(plan, _PLAN_BUFFER_SIZES, item=8)
                return sum(fb.scalar_at(start + 8 * k, "<q") for k in range(1, count))
    return None


def available_bytes() -> int | None:
    """Memory a new allocation can have now: ``MemAvailable``, capped by the cgroup (v2) limit left; ``None`` off
    Linux."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: line.split()[1] for line in f}
        available = int(info["MemAvailable"]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            available = min(available, int(limit) - used)
    except (OSError, ValueError):
        pass
    return available


def _size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def check_planned_memory(program: Any, loaded: Any, method: str, input_names: list[str]) -> None:
    """Raise :class:`UnsupportedError` where ``method`` plans more memory than is available.

    ``loaded`` is the runtime ``Program`` (its method metadata gives each input's planned size, the upper bound of
    its dynamic dims); ``input_names`` the method's tensor inputs in order (the export metadata's). The check is off
    with ``HFEXPORT_SKIP_MEMORY_CHECK=1``.
    """
    if os.environ.get("HFEXPORT_SKIP_MEMORY_CHECK") == "1":
        return
    planned, available = planned_bytes(program, method), available_bytes()
    if planned is None or available is None or planned <= available:
        return
    bounds = []
    try:
        meta = loaded.metadata(method)
        if meta.num_inputs() == len(input_names):  # (else a constant input shifts the slots: no names to give)
            for i, name in enumerate(input_names):
                bounds.append(f"{name} {list(meta.input_tensor_meta(i).sizes())}")
    except (RuntimeError, AttributeError, IndexError):
        pass
    raise UnsupportedError(
        f"the ExecuTorch method {method!r} plans {_size(planned)} of activation memory, allocated at once "
        f"when it loads, and this machine has {_size(available)} available: loading it would be killed for "
        f"memory. ExecuTorch plans every tensor at its dynamic dims' upper bounds"
        + (f" (inputs planned at: {'; '.join(bounds[:6])})" if bounds else "")
        + ". Re-export with smaller bounds, e.g. dynamic_shapes={'input_ids': {0: Dim('batch', max=2), "
        "1: Dim('seq', max=1024)}, ...}, a smaller max_cache_len, or a prefill that keeps only the last position's "
        "logits; or free memory (HFEXPORT_SKIP_MEMORY_CHECK=1 loads anyway)"
    )


def out_of_memory_at_load(program: Any) -> str:
    """What to say when the runtime ran out of memory loading ``program`` (``std::bad_alloc``): the plan of its
    ``forward`` where it can be read, the memory available, and how to plan less."""
    planned, available = planned_bytes(program, "forward"), available_bytes()
    sizes = (f": its 'forward' plans {_size(planned)} of activation memory" if planned else "") + (
        f" and this machine has {_size(available)} available" if available is not None else "")
    return (f"the ExecuTorch runtime ran out of memory (std::bad_alloc) loading the program{sizes}. ExecuTorch plans "
            "every tensor at its dynamic dims' upper bounds: re-export with smaller bounds, e.g. "
            "dynamic_shapes={'input_ids': {0: Dim('batch', max=2), 1: Dim('seq', max=1024)}, ...}, or a smaller "
            "max_cache_len")
