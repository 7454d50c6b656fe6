"""Leaf names and leaves: one name per leaf everywhere (the metadata an export saves, :func:`get_leaf_tensors`'s
keys, a validation report: ``input_ids``, ``logits``, ``past_key_values.layers.0.keys``), and :func:`tensor_leaves`
in that same order, the order of an exported program's inputs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from .caches import (
    cache_class_paths, cache_tensors, context_slot_names, ensure_registered, is_cache, join_name, reads_as_cache,
    register_cache_classes,
)

__all__ = [
    "leaf_name",
    "flatten_with_names",
    "spec_leaf_names",
    "dump_spec",
    "load_spec",
    "register_spec_types",
    "tensor_leaves",
    "get_leaf_tensors",
]


def leaf_name(path: tuple) -> str:
    """Dotted name of a pytree key path: ``past_key_values.layers.0.keys``."""
    parts: list[str] = []
    for key in path:
        if isinstance(key, pytree.MappingKey):
            parts.append(str(key.key))
        elif isinstance(key, pytree.GetAttrKey):
            parts.append(key.name)
        elif isinstance(key, pytree.SequenceKey):
            parts.append(str(key.idx))
        else:
            parts.append(str(key).strip(".[]'\""))
    return ".".join(parts)


def flatten_with_names(
    tree: Any, is_leaf: Callable[[Any], bool] | None = None
) -> tuple[list[tuple[str, Any]], pytree.TreeSpec]:
    """Flatten a pytree into ``(name, leaf)`` pairs and its spec (``is_leaf`` as in ``torch.utils._pytree``)."""
    pairs, spec = pytree.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return [(leaf_name(path), leaf) for path, leaf in pairs], spec


def spec_leaf_names(out_spec: pytree.TreeSpec) -> list[tuple[str, bool]]:
    """``(name, in_cache)`` for each leaf of a tree spec, in flat order, read from the spec alone (an output spec,
    whose values are not at hand): the names :func:`flatten_with_names` gives the same tree's leaves."""
    out: list[tuple[str, bool]] = []

    def walk(spec: pytree.TreeSpec, prefix: str, in_cache: bool) -> None:
        if spec.is_leaf():
            out.append((prefix, in_cache))
            return
        children = spec.children()
        if is_cache(spec.type):
            keys: list[Any] = context_slot_names(spec.context)
            in_cache = True
        elif isinstance(spec.context, list) and len(spec.context) == len(children):
            keys = spec.context  # dict / ModelOutput keys
        elif hasattr(spec.context, "_fields"):
            keys = list(spec.context._fields)  # namedtuple
        else:
            keys = list(range(len(children)))
        for key, child in zip(keys, children):
            walk(child, join_name(prefix, key), in_cache)

    walk(out_spec, "", False)
    return out


def dump_spec(spec: pytree.TreeSpec) -> str:
    return pytree.treespec_dumps(spec)


def load_spec(text: str) -> pytree.TreeSpec:
    """Load a spec saved by :func:`dump_spec`, first registering the cache/output classes it names."""
    register_spec_types(text)
    return pytree.treespec_loads(text)


def register_spec_types(*texts: str | None) -> None:
    """Import and register the transformers classes the saved specs ``texts`` name (caches are registered here; a
    ``ModelOutput`` registers itself when its module is imported), so that a program whose own tree specs name
    them (``torch.export.load`` of a ``.pt2``) loads in a process that never imported the model's module."""
    for text in texts:
        if text:
            ensure_registered(cache_class_paths(json.loads(text)))


def tensor_leaves(tree: Any) -> list[torch.Tensor]:
    """The tensor leaves of ``tree``, in pytree order (the order of :func:`flatten_with_names`, and of an exported
    program's flat inputs); other leaves (ints, ``None``, flags) are left out.

    A cache is read through its tensors without building its pytree context, so a runner can flatten its inputs at
    every decode step cheaply.

    Example:
        >>> tensor_leaves({"input_ids": torch.ones(1, 3), "use_cache": True, "mask": [torch.ones(3)]})
        [tensor([[1., 1., 1.]]), tensor([1., 1., 1.])]
    """
    out: list[torch.Tensor] = []
    for leaf in pytree.tree_leaves(tree, is_leaf=reads_as_cache):
        if isinstance(leaf, torch.Tensor):
            out.append(leaf)
        elif reads_as_cache(leaf):
            out.extend(cache_tensors(leaf))
    return out


def _positional(value: Any) -> bool:
    """A list or tuple subclass (a namedtuple, a ``torch.return_types`` result): :func:`get_leaf_tensors` names its
    items by position, as it always has, where the pytree walk would name a namedtuple's by field."""
    return isinstance(value, list | tuple) and type(value) not in (list, tuple)


def _unopened_children(value: Any) -> list[tuple[Any, Any]]:
    """``(key, child)`` of a container the pytree walk keeps whole: a cache whose class is not registered yet, a
    plain dataclass, a mapping or a sequence of an unregistered class."""
    if is_cache(value):
        register_cache_classes()
        return flatten_with_names(value)[0] if type(value) in pytree.SUPPORTED_NODES else []
    if isinstance(value, Mapping):
        return list(value.items())
    if isinstance(value, list | tuple):
        return list(enumerate(value))
    if hasattr(value, "__dataclass_fields__"):
        return [(name, getattr(value, name)) for name in value.__dataclass_fields__]
    return []


def get_leaf_tensors(obj: Any) -> dict[str, torch.Tensor]:
    """Recursively collect the leaf tensors of a nested structure, keyed by dotted path.

    Handles tensors, dicts, lists, tuples, dataclasses / ``ModelOutput`` and caches. The names are
    :func:`flatten_with_names`'s (a cache's leaves ``past_key_values.layers.0.keys``, a ``ModelOutput``'s fields by
    attribute name, the ones it holds); containers the pytree walk keeps whole (a plain dataclass, a cache class not
    registered yet, a namedtuple, by position) are opened and walked the same way.

    Example:
        >>> get_leaf_tensors({"a": torch.ones(1), "b": [torch.zeros(2)]}).keys()
        dict_keys(['a', 'b.0'])
    """
    out: dict[str, torch.Tensor] = {}

    def walk(value: Any, prefix: str) -> None:
        for name, leaf in flatten_with_names(value, is_leaf=_positional)[0]:
            name = join_name(prefix, name) if name else prefix
            if isinstance(leaf, torch.Tensor):
                out[name] = leaf
            else:
                for key, child in _unopened_children(leaf):
                    walk(child, join_name(name, key))

    walk(obj, "")
    return out
