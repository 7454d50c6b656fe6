"""Streamers for ``generate()`` (ours and ``model.generate`` alike)."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["TimingStreamer"]


class TimingStreamer:
    """A ``generate`` streamer that only records when the prompt and each new token arrive.

    Works with ``model.generate`` and ``ExportedModel.generate`` alike (both call ``put(prompt)``, then ``put(token)``
    per step, then ``end()``), so the two are timed the same way.
    """

    def __init__(self, start: float | None = None):
        self.start = time.perf_counter() if start is None else start
        self.token_times: list[float] = []
        self._prompt_seen = False
        self.ended: float | None = None

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        self.token_times.append(time.perf_counter())

    def end(self) -> None:
        self.ended = time.perf_counter()

    def stats(self) -> dict[str, float | int | None]:
        """``prefill_s`` (start to first token), ``decode_steps``, ``decode_s``, ``decode_tokens_per_s``."""
        times = self.token_times
        if not times:
            return {"prefill_s": None, "decode_steps": 0, "decode_s": 0.0, "decode_tokens_per_s": None}
        steps = len(times) - 1
        decode_s = times[-1] - times[0]
        return {
            "prefill_s": times[0] - self.start,
            "decode_steps": steps,
            "decode_s": decode_s,
            "decode_tokens_per_s": steps / decode_s if steps and decode_s > 0 else None,
        }
