"""The kwargs a capture hands out: read as captured every time.

A forward updates its cache in place (a ``DynamicCache`` grows by the step, a ``StaticCache`` is written at the
step's slots) and, outside ``torch.no_grad``, leaves autograd tensors in it, which ``copy.deepcopy`` (and so
``torch.export``'s own input handling) refuses. The guide's loop runs each component eagerly on its captured kwargs
and then exports it with the same kwargs: :class:`CapturedKwargs` gives each read of a cache a fresh copy of the
captured one, so the eager call cannot change what the export then traces.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, MutableMapping
from typing import Any

from ..pytrees.caches import is_cache

__all__ = ["CapturedKwargs"]


class CapturedKwargs(MutableMapping):
    """A component's captured forward kwargs; ``module(**kwargs)`` and ``exporter.export(module, kwargs)`` each get
    the cache as it was captured (a deep copy per read); the other values are handed out as they are."""

    def __init__(self, kwargs: Any = ()):
        self._data = dict(kwargs)

    def __getitem__(self, key: str) -> Any:
        value = self._data[key]
        return copy.deepcopy(value) if is_cache(value) else value

    def __setitem__(self, key: str, value: Any) -> None:
        self._data[key] = value

    def __delitem__(self, key: str) -> None:
        del self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"CapturedKwargs({self._data!r})"
