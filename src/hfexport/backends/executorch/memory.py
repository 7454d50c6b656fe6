"""The memory an ExecuTorch method plans, checked against what this machine has before the runtime allocates it.

ExecuTorch plans every activation at its upper bound, and ``load_method`` allocates the whole plan at once. A program
planned at the default bounds of :mod:`.bounds` for a large vocabulary (Gemma-3's 262144 logits per position, batch 8
x 2000 positions) plans 17.4 GB: the load was killed by the OOM killer with no Python error. So before loading a
method we read its plan (``ExecutionPlan.non_const_buffer_sizes`` of the program flatbuffer, summed) and refuse, with
the inputs' planned bounds and the ``Dim(max=...)`` to lower them, what does not fit in the memory available now
(``MemAvailable``, and the cgroup's limit or this process's ``ulimit`` where they leave less).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path
from typing import Any

from ...errors import UnsupportedError

__all__ = ["planned_bytes", "available_bytes", "check_planned_memory", "check_file_memory", "out_of_memory_at_load"]

# schema/program.fbs: ExecutionPlan.values, .inputs (indices into values), .non_const_buffer_sizes (index 0 is
# reserved); EValue's union type of a Tensor (KernelTypes: NONE, Null, Int, Bool, Double, Tensor...); Tensor.sizes
_PLAN_VALUES, _PLAN_INPUTS, _PLAN_BUFFER_SIZES, _TENSOR, _TENSOR_SIZES = 2, 3, 8, 5, 2


def planned_bytes(program: Any, method: str) -> int | None:
    """Bytes ``method`` plans: from an ``ExecutorchProgramManager``'s program, or from the ``.pte`` a loaded
    ``executorch.runtime.Program`` came from (``hfexport_path``); ``None`` where neither is at hand."""
    plans = getattr(getattr(program, "executorch_program", None), "execution_plan", None)
    if plans is not None:
        return next((sum(p.non_const_buffer_sizes[1:]) for p in plans if p.name == method), None)
    path = getattr(program, "hfexport_path", None)
    return _plans_in_file(Path(path)).get(method, (None,))[0] if path else None


def _plans_in_file(path: Path) -> dict[str, tuple[int, list[list[int]]]]:
    """``{method: (planned bytes, its tensor inputs' planned shapes)}`` of the ``.pte`` at ``path`` (a file that
    passed ``check_program``)."""
    from .safety import _Flatbuffer, _header

    plans = {}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        _, program_size, _, _ = _header(buf, "ET##", b"eh00", "<IQQQ")
        fb = _Flatbuffer(buf, 0, program_size)
        for plan in fb.tables(fb.root(), 1):
            start, count = fb.vector(plan, _PLAN_BUFFER_SIZES, item=8)
            values, (inputs, n_inputs) = fb.tables(plan, _PLAN_VALUES), fb.vector(plan, _PLAN_INPUTS)
            shapes = []
            for k in range(n_inputs):
                value = values[fb.scalar_at(inputs + 4 * k, "<i")]
                if fb.scalar(value, 0, "<B") == _TENSOR and (tensor := fb.table(value, 1)) is not None:
                    sizes, rank = fb.vector(tensor, _TENSOR_SIZES)
                    shapes.append([fb.scalar_at(sizes + 4 * d, "<i") for d in range(rank)])
            plans[fb.string(plan, 0)] = (sum(fb.scalar_at(start + 8 * k, "<q") for k in range(1, count)), shapes)
    return plans


def available_bytes() -> int | None:
    """Memory a new allocation can have now: ``MemAvailable``, capped by the cgroup (v2) limit left and by this
    process's own limits left (``ulimit -d`` / ``-v``: ``RLIMIT_DATA`` less its data segment ``VmData``,
    ``RLIMIT_AS`` less ``VmSize``); ``None`` off Linux."""
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
    left = _process_limit_left()
    return available if left is None else min(available, left)


def _process_limit_left() -> int | None:
    """What this process's ``RLIMIT_DATA`` and ``RLIMIT_AS`` leave it (the smaller), ``None`` where neither is set: a
    plan under ``MemAvailable`` but over them fails in the runtime's allocation as ``std::bad_alloc`` (the matrix's
    workers run under an 8 GiB ``RLIMIT_DATA``)."""
    try:
        import resource

        limits = {"VmData": resource.getrlimit(resource.RLIMIT_DATA)[0],
                  "VmSize": resource.getrlimit(resource.RLIMIT_AS)[0]}
        with open("/proc/self/status") as f:
            used = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f
                    if line.startswith(("VmData:", "VmSize:"))}
    except (ImportError, OSError, ValueError, IndexError):
        return None
    left = [limit - used.get(key, 0) for key, limit in limits.items() if limit != resource.RLIM_INFINITY]
    return max(min(left), 0) if left else None


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
    shapes = _input_bounds(program, loaded, method)  # (a constant input shifts the slots: then no names to give)
    bounds = [f"{n} {shape}" for n, shape in zip(input_names, shapes)] if len(shapes) == len(input_names) else []
    _refuse(method, planned, available, bounds)


def check_file_memory(path: Path) -> None:
    """Raise :class:`UnsupportedError` where a method of the ``.pte`` at ``path`` (checked by ``check_program``)
    plans more memory than is available: the runtime's ``load_program`` allocates the plans already."""
    if os.environ.get("HFEXPORT_SKIP_MEMORY_CHECK") == "1" or (available := available_bytes()) is None:
        return
    for method, (planned, shapes) in _plans_in_file(path).items():
        if planned > available:
            _refuse(method, planned, available, [f"input {k} {shape}" for k, shape in enumerate(shapes)])


def _refuse(method: str, planned: int, available: int, bounds: list[str]) -> None:
    raise UnsupportedError(
        f"the ExecuTorch method {method!r} plans {_size(planned)} of activation memory, allocated at once "
        f"when it loads, and this process has {_size(available)} available (free memory, less any cgroup or "
        f"ulimit cap): loading it would fail or be killed for memory. ExecuTorch plans every tensor at its "
        f"dynamic dims' upper bounds"
        + (f" (inputs planned at: {'; '.join(bounds[:6])})" if bounds else "")
        + ". Re-export with smaller bounds, e.g. dynamic_shapes={'input_ids': {0: Dim('batch', max=2), "
        "1: Dim('seq', max=1024)}, ...}, a smaller max_cache_len, or a prefill that keeps only the last position's "
        "logits; or free memory (HFEXPORT_SKIP_MEMORY_CHECK=1 loads anyway)"
    )


def _input_bounds(program: Any, loaded: Any, method: str) -> list[list[int]]:
    """The planned shape of each of ``method``'s tensor inputs, in order: from the loaded method's metadata, else
    (before loading) from the memory specs of the manager's program; ``[]`` where neither gives them."""
    try:
        if loaded is not None:
            meta = loaded.metadata(method)
            return [list(meta.input_tensor_meta(i).sizes()) for i in range(meta.num_inputs())]
        graph = program.exported_program(method)
        user = set(graph.graph_signature.user_inputs)
        return [list(node.meta["spec"].shape) for node in graph.graph.nodes
                if node.op == "placeholder" and node.name in user and hasattr(node.meta.get("spec"), "shape")]
    except (RuntimeError, AttributeError, IndexError, KeyError):
        return []


def out_of_memory_at_load(program: Any) -> str:
    """What to say when the runtime ran out of memory loading ``program`` (``std::bad_alloc``): the plan of its
    ``forward`` where it can be read, the memory available, and how to plan less."""
    planned, available = planned_bytes(program, "forward"), available_bytes()
    sizes = (f": its 'forward' plans {_size(planned)} of activation memory" if planned else "") + (
        f" and this process has {_size(available)} available" if available is not None else "")
    return (f"the ExecuTorch runtime ran out of memory (std::bad_alloc) loading the program{sizes}. ExecuTorch plans "
            "every tensor at its dynamic dims' upper bounds: re-export with smaller bounds, e.g. "
            "dynamic_shapes={'input_ids': {0: Dim('batch', max=2), 1: Dim('seq', max=1024)}, ...}, or a smaller "
            "max_cache_len")
