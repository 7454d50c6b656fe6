"""Multimodal models whose ``get_image_features`` / ``get_video_features`` lack ``accepts_precomputed_kwargs``.

An export feeds what a vision tower derives from its grid as inputs of its own (:mod:`hfexport.derived`), under the
grid's modality prefix (``image_window_index``, ``image_pixel_shuffle_index``), and transformers' decorator
``accepts_precomputed_kwargs(modality)`` (``utils/generic.py``) on the innermost ``get_<modality>_features`` strips
that prefix before the tower's ``get_vision_*`` helpers look for their keys. Muse Spark and Muse Glimmer (transformers
5.23) do not carry it: their towers met the prefixed keys, computed the values again from the grid's ``.tolist()``
and the trace stopped on a data-dependent guard (``vision_utils.py:162``). While tracing, such a method gets the
decorator transformers' own families use, the same function applied the same way (innermost definition only, each
modality that the class defines); nothing is patched where the decorator is already there. Drop it once those
families carry the decorator upstream.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..registry import patch_attribute, undo_all, workaround

_MODALITIES = ("image", "video")
_DECORATED = "accepts_precomputed_kwargs.<locals>.decorator.<locals>.wrapper"


def _decorated(method: Any) -> bool:
    while method is not None:
        if getattr(getattr(method, "__code__", None), "co_qualname", "") == _DECORATED:
            return True
        method = getattr(method, "__wrapped__", None)
    return False


def _undecorated(model: Any) -> list[tuple[type, str]]:
    """``(class, method)`` of the innermost ``get_<modality>_features`` definitions (no submodule defines one too)
    that lack the decorator."""
    found = []
    for module in model.modules():
        for modality in _MODALITIES:
            name = f"get_{modality}_features"
            if name not in vars(type(module)) or _decorated(vars(type(module))[name]):
                continue
            inner = (m for m in module.modules() if m is not module and name in vars(type(m)))
            if next(inner, None) is None:
                found.append((type(module), name))
    return list(dict.fromkeys(found))


def _applies(model: Any, inputs: dict) -> bool:
    """Whether ``inputs`` hold a key with the modality prefix of an undecorated method that the method does not name
    (a derived input, not its grid; read off the method, since the model's forward may be wrapped for the trace)."""
    if not isinstance(model, torch.nn.Module):
        return False
    for cls, name in _undecorated(model):
        prefix, params = f"{name.split('_')[1]}_", inspect.signature(vars(cls)[name]).parameters
        if any(k.startswith(prefix) and k not in params for k in inputs):
            return True
    return False


@workaround(
    id="precomputed-kwargs-prefix",
    backend="all",
    target="transformers.models.*.modeling_*.*Model.get_image_features / get_video_features (no "
    "accepts_precomputed_kwargs)",
    breaks="a tower's derived inputs keep their modality prefix and are never used: the tower computes them again "
    "from the grid's values and the trace fails on a data-dependent guard (Muse Spark, Muse Glimmer)",
    upstream="transformers models/muse_spark/modeling_muse_spark.py, models/muse_glimmer/modeling_muse_glimmer.py "
    "(utils/generic.py accepts_precomputed_kwargs); no issue known",
    versions={"transformers": ">=5.20,<5.24"},
    applies=_applies,
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    from transformers.utils.generic import accepts_precomputed_kwargs

    return undo_all([patch_attribute(cls, name, accepts_precomputed_kwargs(name.split("_")[1])(vars(cls)[name]))
                     for cls, name in _undecorated(model)])
