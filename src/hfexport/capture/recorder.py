"""A forward pre-hook that records every call's kwargs: how capture watches ``generate()`` and a multimodal
forward call each submodule."""

from __future__ import annotations

import copy
import inspect
from typing import Any

import torch

__all__ = ["CallRecorder", "GENERATE_HINTS", "NOT_TRACED"]

# generate() passes logits_to_keep=1 for speed; exported graphs return logits for every query position instead,
# as a caller of a multi-token decode (and the spec's decode loop) expects (with logits_to_keep_input, a
# multi-token decode takes the positions as an input: capture.decompose.keep_every_position)
NOT_TRACED = ("logits_to_keep",)
GENERATE_HINTS = ("next_sequence_length", "is_first_iteration")


class CallRecorder:
    """Forward pre-hook that keeps a deep copy of every call's kwargs (the cache as it was at call time)."""

    def __init__(self, module: torch.nn.Module):
        self.calls: list[dict[str, Any]] = []
        parameters = inspect.signature(module.forward).parameters
        self._params = list(parameters)
        # generate()'s own per-step hints, which a forward that does not name them swallows through **kwargs and
        # ignores; torch.export would refuse their dynamic_shapes keys (not the forward's argument names)
        self._hints = tuple(k for k in GENERATE_HINTS if k not in parameters)
        self._handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        named = dict(zip(self._params, args))
        named.update(kwargs)
        for key in (*NOT_TRACED, *self._hints):
            named.pop(key, None)
        self.calls.append(copy.deepcopy(named))

    def remove(self) -> None:
        self._handle.remove()
