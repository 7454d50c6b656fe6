"""The support matrix: every transformers architecture buildable as a tiny model, on every backend.

``hfexport matrix`` discovers architectures from transformers' auto mappings (:mod:`.discovery`), shrinks their
default configs (:mod:`.shrink`), runs each (architecture, backend, stage) case in its own process forked from a
clean preloaded server (:mod:`.worker`, :mod:`.launch`, :mod:`.scheduler`), records each row as it finishes
(:mod:`.results`) and writes CSV, Markdown and a PNG heat map (:mod:`.report`).
"""

from __future__ import annotations

from .discovery import Architecture, discover
from .scheduler import BACKENDS, Case, plan, run_matrix

__all__ = ["Architecture", "BACKENDS", "Case", "discover", "plan", "run_matrix"]
