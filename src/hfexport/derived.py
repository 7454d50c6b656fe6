"""Inputs a model derives from its other inputs in Python before its graph: recorded at export, derived again at
run time.

transformers computes what a packed vision tower needs from an image grid with ``transformers.vision_utils``'s
``get_vision_*`` helpers: rotary positions, packed-sequence offsets, interpolation taps. They loop over the grid's
values (``.tolist()``, ``repeat_interleave``), which ``torch.export`` cannot trace with a symbolic grid, and each
helper returns a precomputed tensor instead when the caller's kwargs hold one under its key (``cu_seqlens``,
``position_ids``, ...): the way transformers means them to be exported. An export records which helper made which
traced input from which input and with which settings (a :class:`DerivedInput`, saved in the metadata), and the
runner calls the same helper on the caller's grid before each run.

Loading runs nothing from the export folder: a recorded helper must be one of :data:`VISION_HELPERS`, its settings
plain JSON scalars.

Example:
    >>> recipe = DerivedInput("get_vision_cu_seqlens", "grid_thw", {"merge_temporal": False}, ("cu_seqlens",))
    >>> derive([recipe], {"grid_thw": torch.tensor([[1, 2, 2]])})["cu_seqlens"].tolist()
    [0, 4]
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import torch

__all__ = ["VISION_HELPERS", "DerivedInput", "derive"]

#: ``transformers.vision_utils`` helper -> the kwargs keys of what it returns (in order; ``None``: a value that is
#: not an input, the flash-attention ``max_seqlen``)
VISION_HELPERS: dict[str, tuple[str | None, ...]] = {
    "get_vision_cu_seqlens": ("cu_seqlens",),
    "get_vision_attention_seqlens": ("cu_seqlens", None),
    "get_vision_position_ids": ("position_ids",),
    "get_vision_window_index": ("window_index", "cu_window_seqlens"),
    "get_vision_interpolation_indices_and_weights": ("interp_indices", "interp_weights"),
    "get_vision_bilinear_indices_and_weights": ("bilinear_indices", "bilinear_weights"),
    "get_vision_nearest_position_ids": ("position_ids",),
    "get_vision_merged_shape": ("merged_shape",),
}

_SCALARS = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    return isinstance(value, _SCALARS) or (isinstance(value, (list, tuple)) and all(_plain(v) for v in value))


@dataclasses.dataclass(frozen=True)
class DerivedInput:
    """``keys`` = ``transformers.vision_utils.<helper>(inputs[source], **args)``."""

    helper: str
    source: str
    args: Mapping[str, Any]
    keys: tuple[str, ...]

    def __post_init__(self) -> None:
        problems = []
        if self.helper not in VISION_HELPERS:
            problems.append(f"helper {self.helper!r} is not one of {sorted(VISION_HELPERS)}")
        elif not set(self.keys) <= {k for k in VISION_HELPERS[self.helper] if k}:
            problems.append(f"keys {list(self.keys)} are not what {self.helper} returns")
        if not isinstance(self.source, str) or not all(isinstance(k, str) for k in self.args):
            problems.append("source and argument names must be strings")
        elif not all(_plain(v) for v in self.args.values()):
            problems.append(f"arguments {dict(self.args)} must be plain numbers, strings or lists of them")
        if problems:
            raise ValueError(f"derived input {self.helper}: {'; '.join(problems)}")

    def to_dict(self) -> dict[str, Any]:
        return {"helper": self.helper, "source": self.source, "args": dict(self.args), "keys": list(self.keys)}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DerivedInput:
        """Raises:
        ValueError: a field is missing or of the wrong type, or the helper is not one of :data:`VISION_HELPERS`."""
        try:
            return cls(values["helper"], values["source"], dict(values.get("args", {})), tuple(values["keys"]))
        except (KeyError, TypeError) as e:
            raise ValueError(f"derived input {dict(values)!r}: {type(e).__name__}: {e}") from None

    def compute(self, source: torch.Tensor) -> dict[str, torch.Tensor]:
        from transformers import vision_utils

        helper = getattr(vision_utils, self.helper)
        config = {"config": None} if "config" in inspect.signature(helper).parameters else {}  # (flash's max only)
        out = helper(source, **config, **self.args)
        values = dict(zip(VISION_HELPERS[self.helper], out if isinstance(out, tuple) else (out,), strict=False))
        return {key: values[key] for key in self.keys}


def derive(recipes: Iterable[DerivedInput], kwargs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The derived inputs ``kwargs`` lacks, from their sources in ``kwargs`` (a recipe whose source is absent or
    whose keys are all given is skipped: the caller's own precomputed tensors win)."""
    derived: dict[str, torch.Tensor] = {}
    for recipe in recipes:
        source = kwargs.get(recipe.source)
        if isinstance(source, torch.Tensor) and any(kwargs.get(k) is None for k in recipe.keys):
            derived.update({k: v for k, v in recipe.compute(source).items() if kwargs.get(k) is None})
    return derived
