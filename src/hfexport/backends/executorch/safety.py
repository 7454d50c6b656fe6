"""Checks on a saved ``.pte`` (and its ``.ptd``) before the ExecuTorch runtime reads them.

What ``Runtime.get().load_program(pte, data_path=ptd)`` and ``load_method`` read and run (executorch 1.5):

- **Files.** The ``.pte`` and the ``.ptd`` the caller passes: tensors stored outside the program name *keys* of
  that data file, never paths. ``load_program`` verifies the program flatbuffer (``verification=`` defaults to
  ``Verification.InternalConsistency``) and the header's sizes against the file, so truncation raises.
- **Code.** Kernels come from the runtime's operator registry (a missing one fails ``load_method``); delegate blobs
  go to the backend registered under the delegate's id: pip's runtime has ``XnnpackBackend``, ``QnnBackend`` and
  ``OpenvinoBackend``. A ``CudaBackend`` blob is an AOTInductor-compiled shared library that a CUDA-built runtime
  loads: such an export is code. hfexport lowers to XNNPACK, CUDA or MLX only.
- **Delegate blobs are not verified.** XNNPACK parses its own flatbuffer (``XN01``) with the runtime's checks only:
  a constant whose ``named_key`` is not UTF-8 makes the failure log line undecodable by the Python log bridge, and
  the process aborts (``std::terminate``) in ``load_method``.

:func:`check_program` reads the headers and flatbuffers (bounds-checked; weights untouched), and refuses segments
outside the file, delegates and operators this export could not have, XNNPACK constants that are not valid UTF-8
keys of the named data, and a ``.ptd`` that is not a listed, well-formed file of the export.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from pathlib import Path

from ...manifest import listed_files, reference_problem
from ...manifest_schema import fail

__all__ = ["check_program"]

_ADVICE = "re-export the model, or get the export from a trusted source"
_NO_OFFSET = (1 << 64) - 1  # an XNNPACK constant stored in named data has this offset


class _Corrupt(Exception):
    """A flatbuffer offset, length or string that does not fit the file."""


class _Flatbuffer:
    """The few reads this module needs from a flatbuffer in ``buf[start:end]``, each bounds-checked (Python has
    no flatbuffer verifier)."""

    def __init__(self, buf: mmap.mmap, start: int, end: int):
        self.buf, self.start, self.end = buf, start, end

    def _get(self, fmt: str, pos: int) -> int:
        if pos < self.start or pos + struct.calcsize(fmt) > self.end:
            raise _Corrupt(f"offset {pos} is outside the flatbuffer")
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def root(self) -> int:
        return self.start + self._get("<I", self.start)

    def _field(self, table: int, index: int) -> int | None:
        vtable = table - self._get("<i", table)
        slot = 4 + 2 * index
        if slot + 2 > self._get("<H", vtable):
            return None
        rel = self._get("<H", vtable + slot)
        return table + rel if rel else None

    def scalar(self, table: int, index: int, fmt: str, default: int = 0) -> int:
        pos = self._field(table, index)
        return default if pos is None else self._get(fmt, pos)

    def table(self, table: int, index: int) -> int | None:
        pos = self._field(table, index)
        return None if pos is None else pos + self._get("<I", pos)

    def vector(self, table: int, index: int, item: int = 4) -> tuple[int, int]:
        """``(start, count)`` of a vector field, ``(0, 0)`` when absent."""
        pos = self._field(table, index)
        if pos is None:
            return 0, 0
        vec = pos + self._get("<I", pos)
        count = self._get("<I", vec)
        if vec + 4 + count * item > self.end:
            raise _Corrupt(f"a vector of {count} items at offset {vec} runs past the end")
        return vec + 4, count

    def tables(self, table: int, index: int) -> list[int]:
        start, count = self.vector(table, index)
        return [start + 4 * k + self._get("<I", start + 4 * k) for k in range(count)]

    def scalar_at(self, pos: int, fmt: str = "<Q") -> int:
        return self._get(fmt, pos)

    def string(self, table: int, index: int) -> str:
        start, count = self.vector(table, index, item=1)
        try:
            return self.buf[start:start + count].decode("utf-8")
        except UnicodeDecodeError:
            raise _Corrupt(f"the string at offset {start} is not UTF-8 (the runtime's log of it would abort the "
                           "process)") from None


def check_program(pte: Path) -> Path | None:
    """Check the ``.pte`` at ``pte`` and its ``.ptd``; return the ``.ptd`` to load with it (``None``: none).

    Raises:
        ManifestError: listing every problem, each naming the file and the plan, delegate or operator.
    """
    from .shared import data_path

    folder, ptd = pte.parent, data_path(pte)
    problems: list[str] = []
    listed = listed_files(folder)
    keys: set[str] = set()  # named data the program may take constants from: its own, and the .ptd's
    has_ptd = os.path.lexists(ptd)
    bad = reference_problem(folder, ptd.name, listed) if has_ptd else None
    if bad:
        problems.append(f"{pte.name}: its data {bad}; {_ADVICE}")
    elif has_ptd:
        problems += [f"{ptd.name}: {p}; {_ADVICE}" for p in _scan(ptd, lambda buf, n: _ptd_problems(buf, n, keys))]
    problems += [f"{pte.name}: {p}; {_ADVICE}" for p in _scan(pte, lambda buf, n: _pte_problems(buf, n, keys))]
    if problems:
        fail(str(pte), problems)  # ManifestError, the list capped
    return ptd if has_ptd else None


def _scan(path: Path, read) -> list[str]:
    """``read(buffer, size)`` over the file memory-mapped (only the pages it reads are loaded: not the weights)."""
    size = os.stat(path).st_size
    if size < 64:
        return [f"{size} bytes is too short for an ExecuTorch file: truncated"]
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            return read(buf, size)
        except _Corrupt as e:
            return [f"corrupt flatbuffer ({e})"]


def _header(buf: mmap.mmap, identifier: str, magic: bytes, fmt: str) -> tuple[int, ...]:
    """The extended header ExecuTorch inserts after the flatbuffer's file identifier (byte 8); ``identifier`` is
    a pattern, ``#`` for a digit."""
    if not re.fullmatch(identifier.replace("#", "[0-9]"), buf[4:8].decode("latin-1")) or buf[8:12] != magic:
        raise _Corrupt(f"no {identifier} file identifier with a {magic.decode()} header: not this kind of file")
    return struct.unpack_from(fmt, buf, 12)


def _pte_problems(buf: mmap.mmap, size: int, keys: set[str]) -> list[str]:
    length, program_size, base, data_size = _header(buf, "ET##", b"eh00", "<IQQQ")
    if length < 32 or program_size > size or base < program_size or base + data_size > size:
        return [f"its header puts the program in bytes 0..{program_size} and the segments in {base}.."
                f"{base + data_size}, but the file has {size}: truncated or corrupt"]
    fb = _Flatbuffer(buf, 0, program_size)
    root = fb.root()
    segments = [(fb.scalar(s, 0, "<Q"), fb.scalar(s, 1, "<Q")) for s in fb.tables(root, 4)]
    problems = [f"segment {i} (bytes {off}..{off + n} of the segment data) lies outside the file: truncated or "
                "corrupt" for i, (off, n) in enumerate(segments) if off + n > data_size]
    subsegments = [fb.table(root, 5)] + fb.tables(root, 6)  # the constant segment, the mutable data segments
    for sub in filter(None, subsegments):
        index, (start, count) = fb.scalar(sub, 0, "<I"), fb.vector(sub, 1, item=8)
        if count and (index >= len(segments) or any(
                fb.scalar_at(start + 8 * k) > segments[index][1] for k in range(count))):
            problems.append(f"constant data points outside segment {index}")
    for named in fb.tables(root, 7):  # the program's own named data (XNNPACK weights)
        keys.add(fb.string(named, 0))
        if fb.scalar(named, 1, "<I") >= len(segments):
            problems.append(f"named data {fb.string(named, 0)!r} points at a segment the file does not have")
    inline = fb.tables(root, 3)
    from .targets import DELEGATES as _DELEGATES  # the delegates ExecutorchConfig.backend lowers to

    operators = _registered_operators()
    for plan in fb.tables(root, 1):
        name = fb.string(plan, 0)
        problems += _value_problems(fb, plan, name, keys)
        for op in fb.tables(plan, 6):
            op_name = ".".join(part for part in (fb.string(op, 0), fb.string(op, 1)) if part)
            if op_name not in operators:
                problems.append(f"plan {name!r} calls the operator {op_name!r}, which this ExecuTorch runtime has "
                                "no kernel for")
        for index, delegate in enumerate(fb.tables(plan, 7)):
            backend = fb.string(delegate, 0)
            label = f"plan {name!r} delegate {index} ({backend})"
            for spec in fb.tables(delegate, 2):
                fb.string(spec, 0)  # decoded: see _value_problems
            if backend not in _DELEGATES.values():
                problems.append(f"{label} is not a backend hfexport lowers to ({sorted(_DELEGATES.values())})")
                continue
            ref = fb.table(delegate, 1)
            location, at = (fb.scalar(ref, 0, "<b"), fb.scalar(ref, 1, "<I")) if ref is not None else (0, 0)
            if location == 1 and at < len(segments) and segments[at][0] + segments[at][1] <= data_size:
                blob = (base + segments[at][0], base + segments[at][0] + segments[at][1])
            elif location == 0 and at < len(inline):
                start, count = fb.vector(inline[at], 0, item=1)
                blob = (start, start + count)
            else:
                problems.append(f"{label} points at blob {at}, which the file does not have")
                continue
            if backend == _DELEGATES["xnnpack"]:
                problems += [f"{label}: {p}" for p in _xnnpack_problems(buf, *blob, keys)]
    return problems


def _value_problems(fb: _Flatbuffer, plan: int, name: str, keys: set[str]) -> list[str]:
    """Every string of the plan's values and stack traces is decoded (one the runtime logs on a failure path
    aborts the process when it is not UTF-8: the Python log bridge cannot decode it); a tensor stored outside the
    program must name a key its named data holds."""
    problems = []
    for index, value in enumerate(fb.tables(plan, 2)):
        kind, payload = fb.scalar(value, 0, "<B"), fb.table(value, 1)  # EValue: a union (type, then table)
        if payload is None:
            continue
        if kind == 6:  # String
            fb.string(payload, 0)
        elif kind == 5 and (info := fb.table(payload, 9)) is not None:  # Tensor, with its extra_tensor_info
            fqn = fb.string(info, 1)
            if fb.scalar(info, 2, "<b") == 1 and fqn not in keys:  # TensorDataLocation.EXTERNAL
                problems.append(f"plan {name!r} value {index} (a tensor) takes its data from {fqn[:80]!r}, which "
                                "no named data holds")
    for chain in fb.tables(plan, 5):
        for frames in fb.tables(chain, 3):
            for frame in fb.tables(frames, 0):
                for field in (0, 2, 3):  # filename, name, context
                    fb.string(frame, field)
    return problems


def _xnnpack_problems(buf: mmap.mmap, start: int, end: int, keys: set[str]) -> list[str]:
    """XNNPACK's blob in ``buf[start:end]``: ``XH00`` header, its ``XN01`` flatbuffer, the constants it takes
    from named data."""
    if end - start < 30 or buf[start + 4:start + 8] != b"XH00":
        return ["its XNNPACK blob has no XH00 header"]
    _, fb_offset, fb_size, const_offset, const_size = struct.unpack_from("<HIIIQ", buf, start + 8)
    if start + fb_offset + fb_size > end or start + const_offset + const_size > end or fb_size < 8:
        return [f"its XNNPACK blob ({end - start} bytes) is shorter than its header says: truncated or corrupt"]
    if buf[start + fb_offset + 4:start + fb_offset + 8] not in (b"XN00", b"XN01"):
        return ["its XNNPACK graph has no XN01 identifier"]
    fb = _Flatbuffer(buf, start + fb_offset, start + fb_offset + fb_size)
    fb.string(fb.root(), 0)  # the graph's version string, decoded: see _value_problems
    problems = []
    for index, constant in enumerate(fb.tables(fb.root(), 8)):
        offset, size = fb.scalar(constant, 0, "<Q"), fb.scalar(constant, 1, "<Q")
        try:
            key = fb.string(constant, 2)
        except _Corrupt:  # the runtime would log the key, and the Python log bridge abort on it
            problems.append(f"XNNPACK constant {index} names its data with a key that is not UTF-8")
            continue
        if key and key not in keys:
            problems.append(f"XNNPACK constant {index} takes its data from {key[:80]!r}, which no named data holds")
        elif not key and offset != _NO_OFFSET and offset + size > const_size:
            problems.append(f"XNNPACK constant {index} (bytes {offset}..{offset + size}) lies outside the blob")
    return problems


def _ptd_problems(buf: mmap.mmap, size: int, keys: set[str]) -> list[str]:
    """A ``.ptd``: its segments lie inside it; its keys are added to ``keys``."""
    length, fb_offset, fb_size, base, data_size = _header(buf, "FT01", b"FH01", "<IQQQQ")
    if length < 40 or fb_offset + fb_size > size or base + data_size > size:
        return [f"its header places data up to byte {max(fb_offset + fb_size, base + data_size)}, but the file has "
                f"{size}: truncated or corrupt"]
    fb = _Flatbuffer(buf, 0, fb_offset + fb_size)
    root = fb.root()
    segments = [(fb.scalar(s, 0, "<Q"), fb.scalar(s, 1, "<Q")) for s in fb.tables(root, 1)]
    problems = [f"segment {i} lies outside the file: truncated or corrupt"
                for i, (off, n) in enumerate(segments) if off + n > data_size]
    for named in fb.tables(root, 2):
        keys.add(fb.string(named, 0))
        if fb.scalar(named, 1, "<I") >= len(segments):
            problems.append(f"named data {fb.string(named, 0)!r} points at a segment the file does not have")
    return problems


def _registered_operators() -> set[str]:
    from executorch.runtime import Runtime

    from .custom_sdpa import register_llama_kernels

    register_llama_kernels()  # the runner registers these before load_method too
    return set(Runtime.get().operator_registry.operator_names)
