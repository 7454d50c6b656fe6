"""Stage timing for the ``hfexport`` command: each stage prints as it finishes, with its wall time, and a stage that
runs longer than 2 s shows its elapsed time while it runs (one status line rewritten in place on a terminal; a line
every 30 s in a log)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from .quiet import terminal

__all__ = ["Progress"]


class Progress:
    """Times named stages and reports each one as it ends (to stderr, or collected for ``--json``)."""

    #: seconds before a running stage shows its elapsed time; seconds between two lines when stderr is not a tty
    SHOW_AFTER, LOG_EVERY = 2.0, 30.0

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.stages: list[dict[str, Any]] = []
        self.notes: list[str] = []
        self._running: list[tuple[str, float]] = []  # (label, start) of the stages running now, innermost last
        self._lock = threading.Lock()
        self._ticker: threading.Thread | None = None
        self._shown = False  # a status line is on the terminal

    def started(self, component: str, stage: str) -> None:
        """An exporter stage starts (``HfExporter.on_stage_start``)."""
        self._push(f"  [{stage}] {component}")

    def _push(self, label: str) -> None:
        if self.quiet:
            return
        with self._lock:
            self._running.append((label, time.perf_counter()))
            if self._ticker is None:
                self._ticker = threading.Thread(target=self._tick, name="hfexport-progress", daemon=True)
                self._ticker.start()

    def _pop(self) -> None:
        if self.quiet:
            return
        with self._lock:
            if self._running:
                self._running.pop()
            self._clear()

    def _say(self, line: str) -> None:
        with self._lock:
            self._clear()
            print(line, file=terminal(), flush=True)

    def _clear(self) -> None:
        if self._shown:
            print("\r\033[K", end="", file=terminal(), flush=True)
            self._shown = False

    def _tick(self) -> None:
        logged: dict[tuple[str, float], float] = {}
        while True:
            time.sleep(0.5)
            with self._lock:
                if not self._running:
                    continue
                label, start = self._running[-1]
                elapsed = time.perf_counter() - start
                if elapsed < self.SHOW_AFTER:
                    continue
                stream = terminal()
                if getattr(stream, "isatty", lambda: False)():
                    print(f"\r{label}: running, {elapsed:.0f}s", end="", file=stream, flush=True)
                    self._shown = True
                elif elapsed - logged.get((label, start), 0.0) >= self.LOG_EVERY:
                    logged[(label, start)] = elapsed
                    print(f"{label}: still running, {elapsed:.0f}s", file=stream, flush=True)

    @contextlib.contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[dict[str, Any]]:
        record: dict[str, Any] = {"stage": name, "detail": detail}
        if not self.quiet:
            self._say(f"[{name}] {detail}".rstrip())
        start = time.perf_counter()
        self._push(f"[{name}]")
        try:
            yield record
        finally:
            self._pop()
            record["seconds"] = round(time.perf_counter() - start, 3)
            self.stages.append(record)
            if not self.quiet:
                self._say(f"[{name}] done in {record['seconds']:.1f}s")

    def note(self, text: str) -> None:
        """A line that says what the command decided (kept in ``notes`` for ``--json``)."""
        self.notes.append(text)
        if not self.quiet:
            self._say(f"[note] {text}")

    def record(self, timing: Any) -> None:
        """One stage the exporter timed (an :class:`hfexport.stages.StageTiming`), as it ends."""
        self._pop()
        record = {"stage": timing.stage, "component": timing.component, "seconds": round(timing.seconds, 3)}
        if timing.parts:
            record["parts"] = {k: round(v, 3) for k, v in timing.parts.items()}
        self.stages.append(record)
        if not self.quiet:
            parts = ", ".join(f"{k} {v:.1f}s" for k, v in timing.parts.items())
            self._say(f"  [{timing.stage}] {timing.component}: {timing.seconds:.1f}s" + (f" ({parts})" if parts else ""))
