"""Dynamic-shape specs for ``torch.export``: ``Dim.AUTO`` everywhere, or the user's, checked against the inputs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import ConfigError
from ..pytrees import is_cache

__all__ = ["StageDynamicShapes", "auto_dynamic_shapes", "resolve_dynamic_shapes"]


class StageDynamicShapes(dict):
    """A user's ``dynamic_shapes`` as it applies to one stage of ``export_for_generation``.

    The decomposition gives a stage inputs the user could not name (the cache, positions, 4-d masks): those get
    ``Dim.AUTO``, as with ``dynamic=True``, so a decode graph still takes a growing cache. Names the stage does not
    take are left out for it; the exporter checks each name against all the stages. A dim the stage's sample has
    at size 0 or 1 (the one new token of a decode step) stays static there: torch.export specialises it anyway.
    """


def _auto(value: Any, static: bool = False) -> Any:
    """``Dim.AUTO`` on every dim of every tensor in ``value`` (``None`` everywhere when ``static``), in the nested
    structure ``torch.export`` expects for it."""
    if isinstance(value, torch.Tensor):
        # sizes 0 and 1 are specialised by torch.export whatever we ask: leave them static, quietly
        dims = {} if static else {i: torch.export.Dim.AUTO for i, size in enumerate(value.shape) if size > 1}
        return dims or None
    node = pytree.SUPPORTED_NODES.get(type(value))
    if node is None or value is None:
        return None
    children, _ = node.flatten_fn(value)
    if is_cache(value) or type(value) not in (dict, list, tuple):
        # torch.export takes a custom pytree node's shapes as the list of its children
        return [_auto(c, static) for c in children]
    if isinstance(value, dict):
        return {k: _auto(v, static) for k, v in value.items()}
    return type(value)(_auto(c, static) for c in children)


def auto_dynamic_shapes(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """``Dim.AUTO`` on every dim of every tensor input, caches included (as the list of their tensors).

    Example:
        >>> auto_dynamic_shapes({"input_ids": torch.ones(2, 3, dtype=torch.long)})
        {'input_ids': {0: Dim.AUTO, 1: Dim.AUTO}}
    """
    return {key: _auto(value) for key, value in inputs.items()}


def _unit_dims_static(spec: Any, value: Any) -> Any:
    if not isinstance(value, torch.Tensor) or not isinstance(spec, Mapping):
        return spec
    kept = {d: dim for d, dim in spec.items() if not (isinstance(d, int) and -value.dim() <= d < value.dim()
                                                        and value.shape[d] <= 1)}
    return kept or None


def resolve_dynamic_shapes(
    config: Any, inputs: Mapping[str, Any], static_caches: bool = False
) -> dict[str, Any] | None:
    """The ``dynamic_shapes`` to pass to ``torch.export`` for ``config``, checked against ``inputs``.

    Explicit ``config.dynamic_shapes`` wins over ``config.dynamic``; kwargs it does not name stay static (a cache
    as the list of its tensors, each static), except in a :class:`StageDynamicShapes`, where they get ``Dim.AUTO``
    (but a ``StaticCache``, whose size is fixed, stays static). ``static_caches``: every cache the explicit spec
    does not name stays static, with ``dynamic=True`` too (ExecuTorch keeps a static cache as fixed-size state).
    """
    shapes = _resolve(config, inputs)
    if not static_caches or not inputs:
        return shapes
    named = getattr(config, "dynamic_shapes", None)
    named = named if isinstance(named, Mapping) else {}
    if shapes is None:
        return None
    return {k: _auto(inputs[k], static=True) if is_cache(inputs[k]) and k not in named else v
            for k, v in shapes.items()}


def _is_static_cache(value: Any) -> bool:
    return is_cache(value) and type(value).__name__ == "StaticCache"


def _resolve(config: Any, inputs: Mapping[str, Any]) -> dict[str, Any] | None:
    explicit = getattr(config, "dynamic_shapes", None)
    if explicit is not None:
        if not isinstance(explicit, Mapping):
            return explicit
        stage = isinstance(explicit, StageDynamicShapes)
        if stage:
            explicit = {k: _unit_dims_static(v, inputs[k]) for k, v in explicit.items() if k in inputs}
        unknown = [k for k in explicit if k not in inputs]
        if unknown:
            raise ConfigError(
                "dynamic_shapes",
                [f"{k!r} is not one of the traced inputs {sorted(inputs)}" for k in unknown],
            )
        problems = []
        for key, spec in explicit.items():
            value = inputs[key]
            if isinstance(value, torch.Tensor) and isinstance(spec, Mapping):
                bad = [d for d in spec if not isinstance(d, int) or not -value.dim() <= d < value.dim()]
                if bad:
                    problems.append(f"{key!r}: dims {bad} out of range for a {value.dim()}-d tensor")
        if problems:
            raise ConfigError("dynamic_shapes", problems)
        return {key: explicit[key] if key in explicit else _auto(value, static=not stage or _is_static_cache(value))
                for key, value in inputs.items()}
    if getattr(config, "dynamic", False):
        return auto_dynamic_shapes(inputs)
    return None

