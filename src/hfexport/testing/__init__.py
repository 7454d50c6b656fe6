"""Models for tests and the demo, all available offline.

- :mod:`hfexport.testing.packaged`: real models shipped inside PyPI packages (SmolLM2-135M-Instruct, all-MiniLM-L6-v2).
- :mod:`hfexport.testing.tiny` (and ``tiny_multimodal``): seeded tiny random-weight models built from configs.

The loader function shares its name with its module, so import it from the module (``hfexport.testing.packaged``
stays the module, which keeps ``import hfexport.testing.packaged`` and monkeypatching it unambiguous). The other
names below are re-exported here and imported on first access, so ``import hfexport.testing`` costs nothing.

Example:
    >>> from hfexport.testing.packaged import packaged
    >>> from hfexport.testing import packaged_dir
    >>> model, tokenizer = packaged("minilm")
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["PACKAGED_MODELS", "cache_root", "packaged_dir"]

_LAZY = {name: "hfexport.testing.packaged" for name in __all__}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
