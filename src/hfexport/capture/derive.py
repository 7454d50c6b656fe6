"""Record the inputs a vision tower derives from its grid with ``transformers.vision_utils`` (see
:mod:`hfexport.derived`), so that the trace takes them as inputs instead of tracing the helpers' Python loops.

:func:`derive_vision_inputs` runs the model once eagerly on the sample inputs with the ``get_vision_*`` helpers its
modeling modules imported wrapped: each call whose first argument is one of the inputs (the grid, by identity) and
whose other arguments are plain settings is recorded as a :class:`~hfexport.derived.DerivedInput`, and its result
joins the traced inputs under the helper's key, which the helper then pops instead of computing. A call it cannot
replay (a grid the model computed, a tensor setting, two calls giving one key different values) is left to the
trace, which fails on it as it did before, naming the model's line.

A vision tower of its own (its grid input ``grid_thw``; no text input, whose model would take a derived
``position_ids`` as its own) records plain keys; a whole multimodal model (``image_grid_thw``, ``video_grid_thw``)
records them under the grid's modality prefix (``image_cu_seqlens``), which its ``get_image_features`` strips
before the tower sees them (transformers' ``accepts_precomputed_kwargs``). Never with a cache input, which the
eager run would advance.

A whole model's own ``compute_3d_position_ids`` (M-RoPE text positions from the prompt's token types and grids) is
recorded the same way, on the caller's ``input_ids`` without a cache, where no ``position_ids`` are given: its
result is fed as ``position_ids``, and the runner derives them again with the model class's method.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ..derived import MODEL_HELPERS, PREFIXES, VISION_HELPERS, DerivedInput, family_helper, helper_returns
from ..pytrees import is_cache
from .multimodal import attribute_snapshot, restore_attributes

__all__ = ["derive_vision_inputs"]

_TEXT_INPUTS = {"input_ids", "inputs_embeds", "decoder_input_ids"}
_UNRECORDED = ("kwargs", "config")  # the helper's own kwargs (where it pops from), and a config (flash only)


def _helper_modules(model: torch.nn.Module) -> dict[Any, list[str]]:
    """The modeling modules of ``model``'s submodules that imported ``get_vision_*`` helpers or define their own
    (a family helper), with their attribute names."""
    from transformers import vision_utils

    found: dict[Any, list[str]] = {}
    for name in {type(m).__module__ for m in model.modules()}:
        module = sys.modules.get(name)
        if module is None:
            continue
        names = [h for h in VISION_HELPERS if getattr(module, h, None) is getattr(vision_utils, h, object())]
        names += [h for h in vars(module) if h.startswith("get_vision_") and h not in VISION_HELPERS
                  and family_helper(_helper_id(module, h))]
        if names:
            found[module] = names
    return found


def _helper_id(module: Any, attribute: str) -> str:
    """What a recipe names the helper ``module.attribute`` by: its own name for ``vision_utils``' helpers,
    ``"<family>.<name>"`` for one a family's modeling module defines (``transformers.models.<family>.modeling_*``)."""
    if attribute in VISION_HELPERS:
        return attribute
    parts = getattr(module, "__name__", "").split(".")
    return f"{parts[2]}.{attribute}" if len(parts) == 4 and parts[:2] == ["transformers", "models"] else attribute


def _prefix(name: str) -> str:
    """``image_`` for ``image_grid_thw``: the modality prefix of a whole model's grid input (``""``: a tower's)."""
    return next((p for p in PREFIXES if p and name.startswith(p)), "")


def _sources(model: torch.nn.Module, inputs: dict[str, Any]) -> dict[int, str]:
    """The grid inputs whose helpers' results can be passed back in, by identity."""
    if any(is_cache(v) for v in inputs.values()):
        return {}
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD
                       for p in inspect.signature(model.forward).parameters.values())
    grids = {id(v): k for k, v in inputs.items() if "grid" in k and isinstance(v, torch.Tensor)}
    return {i: k for i, k in grids.items()
            if (_prefix(k) and takes_kwargs) or (not _prefix(k) and not _TEXT_INPUTS & set(inputs))}


def _recording(helper: str, fn: Callable, sources: dict[int, str], calls: list) -> Callable:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        first, *rest = bound.arguments.items()
        settings = {k: v for k, v in rest if k not in _UNRECORDED}
        values = dict(zip(helper_returns(helper) or (), out if isinstance(out, tuple) else (out,), strict=False))
        tensors = {k: v for k, v in values.items() if k and isinstance(v, torch.Tensor)}
        source = sources.get(id(first[1]))
        try:
            recipe = DerivedInput(helper, source, settings, tuple(tensors), _prefix(source)) if source else None
        except ValueError:  # a tensor setting (a per-image merge size): not replayable from the grid alone
            recipe = None
        # an unreplayable call marks its keys under every prefix: no recipe feeds them, the trace meets the call
        prefixes = [recipe.prefix] if recipe is not None else PREFIXES
        calls.append((recipe, {p + k: v for p in prefixes for k, v in tensors.items()}))
        return out

    return wrapper


def _recording_method(owner: torch.nn.Module, helper: str, inputs: dict[str, Any], calls: list) -> Callable:
    """``owner.<helper>`` (a :data:`MODEL_HELPERS` method) recording its result on the caller's own text inputs."""
    fn = getattr(owner, helper)
    signature = inspect.signature(fn)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        bound = signature.bind(*args, **kwargs).arguments
        own = bound.get("input_ids") is inputs.get("input_ids") is not None and bound.get("past_key_values") is None
        if own and isinstance(out, torch.Tensor):
            recipe = DerivedInput(helper, "input_ids", {"owner": type(owner).__name__}, MODEL_HELPERS[helper])
            calls.append((recipe, dict(zip(recipe.names, (out,), strict=True))))
        elif out is not None:
            calls.append((None, dict(zip(MODEL_HELPERS[helper], (out,), strict=True))))
        return out

    return wrapper


def _owners(model: torch.nn.Module, inputs: dict[str, Any]) -> list[tuple[torch.nn.Module, str]]:
    """The submodules whose class has a :data:`MODEL_HELPERS` method to record (the config must be the model's,
    which is all the runner will have)."""
    if "position_ids" in inputs or not isinstance(inputs.get("input_ids"), torch.Tensor):
        return []
    import transformers

    return [(m, h) for m in model.modules() for h in MODEL_HELPERS if callable(getattr(type(m), h, None))
            and getattr(m, "config", None) is getattr(model, "config", object())
            and getattr(transformers, type(m).__name__, None) is type(m)]


@contextlib.contextmanager
def _patched(modules: dict[Any, list[str]], wrap: Callable[[str, Callable], Callable],
             owners: list[tuple[torch.nn.Module, str, Callable]] = ()) -> Iterator[None]:
    """Each helper of ``modules`` replaced by ``wrap(name, helper)``, each ``(owner, method, replacement)`` set, for
    the scope."""
    saved = [(module, name, getattr(module, name)) for module, names in modules.items() for name in names]
    try:
        for module, name, fn in saved:
            setattr(module, name, wrap(_helper_id(module, name), fn))
        for owner, helper, replacement in owners:  # (an instance attribute over the class's method, deleted on exit)
            setattr(owner, helper, replacement)
        yield
    finally:
        for module, name, fn in saved:
            setattr(module, name, fn)
        for owner, helper, _ in owners:
            vars(owner).pop(helper, None)


def derive_vision_inputs(model: torch.nn.Module,
                         inputs: dict[str, Any]) -> tuple[dict[str, Any], list[DerivedInput]]:
    """``inputs`` with the tensors the model's ``get_vision_*`` helpers derive from a grid input, and the recipes
    that derive them again; ``(inputs, [])`` where there is nothing to record."""
    sources = _sources(model, inputs)
    modules = _helper_modules(model) if sources else {}
    owners = _owners(model, inputs) if sources else []
    if not modules and not owners:
        return inputs, []
    calls: list = []
    snapshot = attribute_snapshot(model)  # (Qwen2-VL keeps its rope deltas on the module)
    try:
        recording = [(owner, helper, _recording_method(owner, helper, inputs, calls)) for owner, helper in owners]
        with _patched(modules, lambda name, fn: _recording(name, fn, sources, calls), recording), torch.no_grad():
            model(**inputs)
    finally:
        restore_attributes(snapshot)
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
    recipes = [r for r in recipes if not conflicting & set(r.names) and not set(r.names) & set(inputs)]
    keys = {k for r in recipes for k in r.names}
    derived = {k: v for k, v in derived.items() if k in keys}
    if any(r.prefix for r in recipes) and not _TEXT_INPUTS & set(inputs) and _unstripped(model, inputs, derived,
                                                                                          modules):
        # a get_image_features without transformers' accepts_precomputed_kwargs (Muse Glimmer's, Kimi K2.5's)
        # passes its kwargs to the tower as they come: where no language model shares them (the image features
        # part), the tower's helpers get their own keys
        recipes = [dataclasses.replace(r, prefix="") for r in recipes]
        derived = {k.removeprefix(_prefix(k)): v for k, v in derived.items()}
    return {**inputs, **derived}, recipes


def _unstripped(model: torch.nn.Module, inputs: dict[str, Any], derived: dict[str, Any],
                modules: dict[Any, list[str]]) -> bool:
    """Whether a helper, run again with the derived inputs given, meets them still under their modality prefix."""
    met: list[bool] = []

    def checking(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            given = signature.bind(*args, **kwargs).arguments.get("kwargs") or {}
            met.append(any(key in derived and _prefix(key) for key in given))
            return fn(*args, **kwargs)

        return wrapper

    snapshot = attribute_snapshot(model)
    try:
        with _patched(modules, lambda name, fn: checking(fn)), torch.no_grad():
            model(**inputs, **derived)
    except Exception:  # noqa: BLE001 - the check itself failed: keep the recipes as transformers means them
        return False
    finally:
        restore_attributes(snapshot)
    return any(met)
