"""Timing helpers shared by ``hfexport run`` and ``hfexport bench``: one timed ``generate`` call, summaries of
repeated rounds, peak RSS, and streamers that print text as it comes and fan a stream out to several listeners.

Prefill and decode are timed apart with :class:`~hfexport.generation.streamers.TimingStreamer`: ``generate`` hands
the streamer the prompt, then each token as it is chosen, so the first token's time is the prefill (time to first
token) and the gaps after it are decode steps. ``model.generate`` and ``ExportedModel.generate`` call a streamer the
same way, so both sides of a comparison are timed by the same code.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, TextIO

__all__ = ["TextPrinter", "Tee", "timed_generate", "best_and_median", "peak_rss_mb"]


class Tee:
    """A streamer that hands every ``put`` / ``end`` to each of ``streamers`` (``None`` entries are skipped)."""

    def __init__(self, *streamers: Any):
        self.streamers = [s for s in streamers if s is not None]

    def put(self, value: Any) -> None:
        for streamer in self.streamers:
            streamer.put(value)

    def end(self) -> None:
        for streamer in self.streamers:
            streamer.end()


class TextPrinter:
    """Prints the new tokens of one generation (batch 1) as text while they come, then a newline; skips the prompt.

    Unlike transformers' ``TextStreamer`` it never splits its token cache (that one restarts decoding after a
    newline), so what it prints is exactly ``tokenizer.decode(new_tokens, skip_special_tokens=True)``: the
    whole reply is decoded on each token and only a stable prefix (up to the last whitespace, never a half
    multi-byte character) is written before the end.
    """

    def __init__(self, tokenizer: Any, out: TextIO | None = None):
        self.tokenizer = tokenizer
        self.out = out
        self.tokens: list[int] = []
        self.printed = 0
        self._prompt_seen = False

    def _write(self, text: str) -> None:
        out = self.out or sys.stdout  # looked up late: tests swap sys.stdout
        out.write(text)
        out.flush()

    def text(self) -> str:
        return self.tokenizer.decode(self.tokens, skip_special_tokens=True)

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
            return
        if value.dim() > 1:
            if value.shape[0] != 1:
                raise ValueError("TextPrinter streams one sequence (batch 1)")
            value = value[0]
        self.tokens.extend(value.tolist())
        text = self.text()
        stable = max(text.rfind(" "), text.rfind("\n")) + 1
        if text.endswith("\ufffd"):  # an incomplete multi-byte character: wait for the rest
            stable = min(stable, len(text) - 1)
        if stable > self.printed:
            self._write(text[self.printed : stable])
            self.printed = stable

    def end(self) -> None:
        self._write(self.text()[self.printed :] + "\n")
        self.printed = 0
        self.tokens = []
        self._prompt_seen = False


def timed_generate(generate: Callable[..., Any], inputs: dict[str, Any], *, streamer: Any = None,
                   timed: bool = True, prompt_len: int | None = None, **generation: Any
                   ) -> tuple[list[int], dict[str, Any]]:
    """``generate(**inputs, **generation)`` for one prompt, timed; returns the new token ids and the stats.

    The stats are :meth:`TimingStreamer.stats` (``prefill_s``, ``decode_steps``, ``decode_s``,
    ``decode_tokens_per_s``) plus ``generate_s``. ``streamer`` also receives the stream (e.g. a
    :class:`TextPrinter`). With ``timed=False`` (beam search, which takes no streamer) only ``generate_s`` is
    measured and the prefill/decode stats are ``None``.

    The new tokens are the ones the stream carried after the prompt when timed; untimed, what follows the first
    ``prompt_len`` positions (default: the length of ``input_ids``; an encoder-decoder model passes 0, its
    sequences hold no encoder prompt).
    """
    from ..generation.streamers import TimingStreamer

    timer = TimingStreamer() if timed else None
    start = timer.start if timer is not None else time.perf_counter()
    stream = Tee(timer, streamer) if timed else None
    sequences = generate(**inputs, **generation, **({"streamer": stream} if stream is not None else {}))
    generate_s = time.perf_counter() - start
    if timer is not None:  # batch 1: the stream's tokens are the last ones of the sequence
        new_ids = sequences[0, sequences.shape[-1] - len(timer.token_times):].tolist()
        stats: dict[str, Any] = timer.stats()
    else:
        start_at = inputs["input_ids"].shape[-1] if prompt_len is None else prompt_len
        new_ids = sequences[0, start_at:].tolist()
        stats = {"prefill_s": None, "decode_steps": None, "decode_s": None, "decode_tokens_per_s": None}
    stats["generate_s"] = generate_s
    return new_ids, stats


def best_and_median(values: Sequence[float | None], *, higher_is_better: bool) -> tuple[float | None, float | None]:
    """The best and the median of ``values`` (``None`` entries ignored; ``(None, None)`` when none is left)."""
    present = [v for v in values if v is not None]
    if not present:
        return None, None
    best = max(present) if higher_is_better else min(present)
    return best, statistics.median(present)


def peak_rss_mb() -> float | None:
    """This process's peak resident set size so far, in MB (``ru_maxrss``: KiB on Linux, bytes on macOS); ``None``
    where the platform has no ``resource`` module (Windows)."""
    try:
        import resource
    except ImportError:
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1e6 if sys.platform == "darwin" else peak * 1024 / 1e6
