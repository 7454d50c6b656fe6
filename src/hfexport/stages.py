"""The stages of one graph's export, as :class:`~hfexport.exporter.HfExporter`'s template runs them.

check → prepare → [workaround scope: trace → quantize (FX graph) → signature → lower] → finish (plus ``capture``
and ``calibrate`` before the graphs of ``export_for_generation``, and ``quantize`` before ``check`` for a quantizer of
the eager module, which traces a quantized copy). Each stage is timed into a
:class:`StageTiming`, and an exception from inside one becomes an :class:`~hfexport.errors.ExportError` that names
the component and the stage it failed in, with a hint where the failure is a known one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import torch

from .errors import ExportError, HfExportError

__all__ = ["STAGES", "ExportStep", "StageTiming", "StageClock"]

logger = logging.getLogger(__name__)

#: every stage, in the order one export runs them
STAGES = ("capture", "calibrate", "check", "prepare", "trace", "quantize", "signature", "lower", "finish")

# Known failure signatures -> what to try. Matched on the text of the underlying exception.
_HINTS: tuple[tuple[str, str], ...] = (
    ("data-dependent", "the model's code is data-dependent (it branches on, or sizes by, tensor values): rewrite "
     "that branch with torch.cond / torch.where, or for a size check try "
     "prefer_deferred_runtime_asserts_over_guards=True (tracing the sample's branch with its values, which every "
     "backend tries first, did not get past it here)"),
    ("Constraints violated", "a dim you marked dynamic is specialised by the model; use Dim.AUTO (dynamic=True) "
     "or keep that dim static"),
    ("is not a pytree", "an input type is not registered with torch.utils._pytree; pass tensors or caches"),
    ("flash", "set attn_implementation='sdpa' or 'eager'"),
)


def hint_for(error: BaseException) -> str | None:
    """What to try for a known failure, from the text of the exception."""
    text = f"{type(error).__name__}: {error}"
    return next((hint for needle, hint in _HINTS if needle in text), None)


def first_lines(text: str, n: int = 12) -> str:
    lines = text.strip().splitlines()
    return "\n".join(lines[:n]) + (f"\n  ... ({len(lines) - n} more lines)" if len(lines) > n else "")


@dataclasses.dataclass
class StageTiming:
    """Wall time of one stage of one component's export; ``parts`` are the sub-steps a backend timed inside it
    (ExecuTorch's ``to_edge_and_lower`` and ``to_executorch`` inside ``lower``)."""

    component: str
    stage: str
    seconds: float
    parts: dict[str, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ExportStep:
    """One graph's export in progress: what a backend's stage hooks read.

    Attributes:
        component: The component's name (``"model"``, ``"decode"``, ...).
        model: The (sub)model being exported.
        sample_inputs: The forward kwargs as the caller (or the backend's own scope) passed them.
        config: The component's export config.
        inputs: The inputs actually traced (after ``prepare``; copies, never the caller's).
        plan: What a backend decided for this graph before tracing (its own typed object, or None).
        parts: Sub-step timings a backend records inside a stage (seconds by name), moved into that stage's
            :class:`StageTiming` when the stage ends.
    """

    component: str
    model: torch.nn.Module
    sample_inputs: MutableMapping[str, Any]
    config: Any
    inputs: MutableMapping[str, Any] | None = None
    plan: Any = None
    parts: dict[str, float] = dataclasses.field(default_factory=dict)


class StageClock:
    """Times stages into :attr:`timings` (and tells ``listener`` as each ends) and turns an untyped failure inside
    one into an ``ExportError``."""

    def __init__(self, listener: Callable[[StageTiming], None] | None = None,
                 starting: Callable[[str, str], None] | None = None) -> None:
        self.timings: list[StageTiming] = []
        self.listener = listener
        self.starting = starting  # told (component, stage) as each stage starts
        #: ids of the quantizers whose environment this export already checked (once per export, not per graph)
        self.checked_quantizers: set[int] = set()

    @contextlib.contextmanager
    def stage(self, name: str, component: str, model: Any = None, inputs: Mapping[str, Any] | None = None,
              step: ExportStep | None = None) -> Iterator[None]:
        if self.starting is not None:
            self.starting(component, name)
        start = time.perf_counter()
        try:
            yield
        except HfExportError:
            raise
        except Exception as e:  # noqa: BLE001 - re-raised with the component and the stage
            raise ExportError(
                f"{type(e).__name__}: {first_lines(str(e))}",
                component=component,
                submodule=type(model).__name__ if model is not None else None,
                input_keys=list(inputs) if isinstance(inputs, Mapping) else [],
                stage=name,
                hint=hint_for(e),
            ) from e
        finally:
            seconds = time.perf_counter() - start
            parts = {}
            if step is not None:
                parts, step.parts = step.parts, {}
            timing = StageTiming(component, name, seconds, parts)
            self.timings.append(timing)
            logger.debug("%s: %s %.2fs", component, name, seconds)
            if self.listener is not None:
                self.listener(timing)
