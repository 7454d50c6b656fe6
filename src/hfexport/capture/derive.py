"""Record the inputs a vision tower derives from its grid with ``transformers.vision_utils`` (see
:mod:`hfexport.derived`), so that the trace takes them as inputs instead of tracing the helpers' Python loops.

:func:`derive_vision_inputs` runs the model once eagerly on the sample inputs with the ``get_vision_*`` helpers its
modeling modules imported wrapped: each call whose first argument is one of the inputs (the grid, by identity) and
whose other arguments are plain settings is recorded as a :class:`~hfexport.derived.DerivedInput`, and its result
joins the traced inputs under the helper's key, which the helper then pops instead of computing. A call it cannot
replay (a grid the model computed, a tensor setting, two calls giving one key different values) is left to the
trace, which fails on it as it did before, naming the model's line.

Only for a vision tower of its own (an input is a grid, ``*grid*``; no text input, whose model would take a derived
``position_ids`` as its own; no cache, which the eager run would advance): the image encoder a multimodal export
splits off, or a ``*_vision`` model.
"""

from __future__ import annotations

import contextlib
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..derived import VISION_HELPERS, DerivedInput
from ..pytrees import is_cache

__all__ = ["derive_vision_inputs"]

_TEXT_INPUTS = {"input_ids", "inputs_embeds", "decoder_input_ids"}
_UNRECORDED = ("kwargs", "config")  # the helper's own kwargs (where it pops from), and a config (flash only)


def _helper_modules(model: torch.nn.Module) -> dict[Any, list[str]]:
    """The modeling modules of ``model``'s submodules that imported ``get_vision_*`` helpers, with their names."""
    from transformers import vision_utils

    found: dict[Any, list[str]] = {}
    for name in {type(m).__module__ for m in model.modules()}:
        module = sys.modules.get(name)
        names = [h for h in VISION_HELPERS if getattr(module, h, None) is getattr(vision_utils, h, object())]
        if names:
            found[module] = names
    return found


def _recording(helper: str, fn: Callable, sources: dict[int, str], calls: list) -> Callable:
    signature = inspect.signature(fn)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        first, *rest = bound.arguments.items()
        settings = {k: v for k, v in rest if k not in _UNRECORDED}
        values = dict(zip(VISION_HELPERS[helper], out if isinstance(out, tuple) else (out,), strict=False))
        tensors = {k: v for k, v in values.items() if k and isinstance(v, torch.Tensor)}
        source = sources.get(id(first[1]))
        try:
            recipe = DerivedInput(helper, source, settings, tuple(tensors)) if source else None
        except ValueError:  # a tensor setting (a per-image merge size): not replayable from the grid alone
            recipe = None
        calls.append((recipe, tensors))
        return out

    return wrapper


@contextlib.contextmanager
def _patched(modules: dict[Any, list[str]], sources: dict[int, str], calls: list) -> Iterator[None]:
    saved = [(module, name, getattr(module, name)) for module, names in modules.items() for name in names]
    try:
        for module, name, fn in saved:
            setattr(module, name, _recording(name, fn, sources, calls))
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)


def derive_vision_inputs(model: torch.nn.Module,
                         inputs: dict[str, Any]) -> tuple[dict[str, Any], list[DerivedInput]]:
    """``inputs`` with the tensors the model's ``get_vision_*`` helpers derive from a grid input, and the recipes
    that derive them again; ``(inputs, [])`` where there is nothing to record."""
    grids = {id(v): k for k, v in inputs.items() if "grid" in k and isinstance(v, torch.Tensor)}
    if not grids or any(is_cache(v) for v in inputs.values()) or _TEXT_INPUTS & set(inputs):
        return inputs, []  # (a text model's forward would take a derived position_ids as its own)
    modules = _helper_modules(model)
    if not modules:
        return inputs, []
    calls: list = []
    with _patched(modules, grids, calls), torch.no_grad():
        model(**inputs)
    derived: dict[str, torch.Tensor] = {}
    recipes: list[DerivedInput] = []
    conflicting: set[str] = set()
    for recipe, tensors in calls:
        for key, value in tensors.items():
            if recipe is None or (key in derived and not torch.equal(derived[key], value)):
                conflicting.add(key)
            derived.setdefault(key, value)
        if recipe is not None and recipe not in recipes:
            recipes.append(recipe)
    recipes = [r for r in recipes if not conflicting & set(r.keys) and not set(r.keys) & set(inputs)]
    keys = {k for r in recipes for k in r.keys}
    return {**inputs, **{k: v for k, v in derived.items() if k in keys}}, recipes
