"""Models for tests and the demo, all available offline.

- :mod:`hfexport.models.packaged`: real models shipped inside PyPI packages (SmolLM2-135M-Instruct, all-MiniLM-L6-v2).
- :mod:`hfexport.models.tiny` (and ``tiny_multimodal``): seeded tiny random-weight models built from configs.

The loader function shares its name with its module, so import it from the module (``hfexport.models.packaged``
stays the module, which keeps ``import hfexport.models.packaged`` and monkeypatching it unambiguous). The other
names below are re-exported here and imported on first access, so ``import hfexport.models`` costs nothing.

Example:
    >>> from hfexport.models.packaged import packaged
    >>> from hfexport.models import packaged_dir
    >>> model, tokenizer = packaged("minilm")
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PACKAGED_MODELS", "cache_root", "packaged_dir"]

_LAZY = {name: "hfexport.models.packaged" for name in __all__}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
