"""Inputs a model derives from its other inputs in Python before its graph: recorded at export, derived again at
run time.

transformers computes what a packed vision tower needs from an image grid with ``transformers.vision_utils``'s
``get_vision_*`` helpers: rotary positions, packed-sequence offsets, interpolation taps. They loop over the grid's
values (``.tolist()``, ``repeat_interleave``), which ``torch.export`` cannot trace with a symbolic grid, and each
helper returns a precomputed tensor instead when the caller's kwargs hold one under its key (``cu_seqlens``,
``position_ids``, ...): the way transformers means them to be exported. An export records which helper made which
traced input from which input and with which settings (a :class:`DerivedInput`, saved in the metadata), and the
runner calls the same helper on the caller's grid before each run.

A whole multimodal model with M-RoPE (Qwen2-VL and its ~20 successors) also computes its 3D text positions from the
prompt's token types and grids (``compute_3d_position_ids``, a Python loop over runs of tokens): the same way, the
model class's own weight-free method (:data:`MODEL_HELPERS`) is named with its class, called on the caller's inputs
and the export's config (:class:`ConfigOnly`), and the result fed as ``position_ids``, which the forward takes as
given.

Some families define such a helper in their own modeling module, with the same contract (Muse Spark's and Muse
Glimmer's ``get_vision_pixel_shuffle_index``, Kimi K2.5's ``get_vision_frame_index``): a family helper, named
``"<family>.get_vision_<name>"``, whose keys are the ones it pops from its ``kwargs`` (:func:`family_helper`).

Loading runs nothing from the export folder: a recorded helper must be one of :data:`VISION_HELPERS`,
:data:`MODEL_HELPERS` (a class of transformers that defines it) or a family helper (a ``get_vision_*`` function of
``transformers.models.<family>.modeling_<family>`` that pops its keys), its settings plain JSON scalars.

Example:
    >>> recipe = DerivedInput("get_vision_cu_seqlens", "grid_thw", {"merge_temporal": False}, ("cu_seqlens",))
    >>> derive([recipe], {"grid_thw": torch.tensor([[1, 2, 2]])})["cu_seqlens"].tolist()
    [0, 4]
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import re
import types
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .errors import UnsupportedError

__all__ = ["VISION_HELPERS", "MODEL_HELPERS", "PREFIXES", "ConfigOnly", "DerivedInput", "derive", "family_helper",
           "helper_returns"]

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

#: a model class's own method that derives inputs from others without weights -> the kwargs keys of what it returns
#: (its ``args``: ``{"owner": <the transformers class that defines it>}``)
MODEL_HELPERS: dict[str, tuple[str, ...]] = {
    "compute_3d_position_ids": ("position_ids",),
}

#: the modality prefixes transformers' ``accepts_precomputed_kwargs`` strips (``""``: a vision tower's own input)
PREFIXES = ("", "image_", "video_")

_SCALARS = (bool, int, float, str, type(None))
_POPPED = re.compile(r"""kwargs\.pop\(["'](\w+)["']""")


@functools.lru_cache(maxsize=None)
def family_helper(name: str) -> tuple[Any, tuple[str, ...]] | None:
    """``(function, keys)`` of the family helper ``"<family>.get_vision_<name>"``: a function of that name defined in
    ``transformers.models.<family>.modeling_<family>`` that takes ``kwargs`` and pops its precomputed ``keys`` from
    them (read from its source); ``None`` where ``name`` is not one. Found once per name: the runner derives the
    inputs before every call, and reading the source each time would be file I/O on that path."""
    family, _, function = name.partition(".")
    if not (family.isidentifier() and function.isidentifier() and function.startswith("get_vision_")):
        return None
    module_name = f"transformers.models.{family}.modeling_{family}"
    try:  # (a name read from an export's metadata: any failure to find it is "not a family helper")
        module = importlib.import_module(module_name)
        fn = vars(module).get(function)
        fn = inspect.unwrap(fn) if callable(fn) else fn  # (while an export records its calls, a wrapper stands there)
        if not inspect.isfunction(fn) or fn.__module__ != module_name \
                or "kwargs" not in inspect.signature(fn).parameters:
            return None
        keys = tuple(dict.fromkeys(_POPPED.findall(inspect.getsource(fn))))
    except Exception:  # noqa: BLE001 - a module that does not import here, a function without its source
        return None
    return (fn, keys) if keys else None


def helper_returns(name: str) -> tuple[str | None, ...] | None:
    """The kwargs keys of what the helper ``name`` returns (of :data:`VISION_HELPERS`, :data:`MODEL_HELPERS` or a
    family helper), ``None`` where it is none of them."""
    if name in VISION_HELPERS or name in MODEL_HELPERS:
        return VISION_HELPERS.get(name) or MODEL_HELPERS[name]
    found = family_helper(name) if "." in name else None
    return found[1] if found else None


def _plain(value: Any) -> bool:
    return isinstance(value, _SCALARS) or (isinstance(value, (list, tuple)) and all(_plain(v) for v in value))


@dataclasses.dataclass(frozen=True)
class DerivedInput:
    """``prefix + keys`` = ``transformers.vision_utils.<helper>(inputs[source], **args)``.

    ``prefix`` is the modality of a whole multimodal model's input (``image_`` for ``image_grid_thw``): its
    ``get_image_features`` strips it before the tower's helpers look for their keys (transformers'
    ``accepts_precomputed_kwargs``), so ``image_cu_seqlens`` reaches the tower as ``cu_seqlens`` and never the
    language model."""

    helper: str
    source: str
    args: Mapping[str, Any]
    keys: tuple[str, ...]
    prefix: str = ""

    def __post_init__(self) -> None:
        problems = []
        returns = helper_returns(self.helper) if isinstance(self.helper, str) else None
        if returns is None:
            problems.append(f"helper {self.helper!r} is not one of {sorted({*VISION_HELPERS, *MODEL_HELPERS})} "
                            "nor a family's get_vision_* helper")
        elif not set(self.keys) <= {k for k in returns if k}:
            problems.append(f"keys {list(self.keys)} are not what {self.helper} returns")
        elif self.helper in MODEL_HELPERS and (set(self.args) != {"owner"} or not str(self.args["owner"]).isidentifier()):
            problems.append(f"{self.helper} takes one argument, owner (a class name), not {dict(self.args)}")
        if self.prefix not in PREFIXES:
            problems.append(f"prefix {self.prefix!r} is not one of {list(PREFIXES)}")
        if not isinstance(self.source, str) or not all(isinstance(k, str) for k in self.args):
            problems.append("source and argument names must be strings")
        elif not all(_plain(v) for v in self.args.values()):
            problems.append(f"arguments {dict(self.args)} must be plain numbers, strings or lists of them")
        if problems:
            raise ValueError(f"derived input {self.helper}: {'; '.join(problems)}")

    @property
    def names(self) -> tuple[str, ...]:
        """The input names the derived tensors go under (``keys`` with the prefix)."""
        return tuple(self.prefix + k for k in self.keys)

    def to_dict(self) -> dict[str, Any]:
        out = {"helper": self.helper, "source": self.source, "args": dict(self.args), "keys": list(self.keys)}
        return {**out, "prefix": self.prefix} if self.prefix else out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DerivedInput:
        """Raises:
        ValueError: a field is missing or of the wrong type, or the helper is not one of :data:`VISION_HELPERS`."""
        try:
            return cls(values["helper"], values["source"], dict(values.get("args", {})), tuple(values["keys"]),
                       values.get("prefix", ""))
        except (KeyError, TypeError) as e:
            raise ValueError(f"derived input {dict(values)!r}: {type(e).__name__}: {e}") from None

    def compute(self, kwargs: Mapping[str, Any], config: Any = None) -> dict[str, torch.Tensor]:
        """The derived tensors from the caller's ``kwargs`` (a model helper also needs the export's ``config``)."""
        if self.helper in MODEL_HELPERS:
            return self._compute_with_model_class(kwargs, config)
        from transformers import vision_utils

        family = family_helper(self.helper) if "." in self.helper else None
        helper = family[0] if family else getattr(vision_utils, self.helper)
        settings = {"config": None} if "config" in inspect.signature(helper).parameters else {}  # (flash's max only)
        out = helper(kwargs[self.source], **settings, **self.args)
        returns = helper_returns(self.helper) or ()
        values = dict(zip(returns, out if isinstance(out, tuple) else (out,), strict=False))
        return {self.prefix + key: values[key] for key in self.keys}

    def _compute_with_model_class(self, kwargs: Mapping[str, Any], config: Any) -> dict[str, torch.Tensor]:
        import transformers

        owner = getattr(transformers, self.args["owner"], None)
        if not isinstance(owner, type) or not issubclass(owner, transformers.PreTrainedModel) \
                or not callable(getattr(owner, self.helper, None)):
            raise UnsupportedError(f"this export derives {list(self.keys)} with {self.args['owner']}.{self.helper}, "
                                   f"which transformers {transformers.__version__} does not have: pass "
                                   f"{list(self.keys)} yourself, or install the transformers it was exported with")
        if config is None:
            raise UnsupportedError(f"{list(self.keys)} are derived with {owner.__name__}.{self.helper}, which needs "
                                   "the model config: call the ExportedModel (not its runner), or pass them yourself")
        method = getattr(ConfigOnly(owner, config), self.helper)
        params = inspect.signature(method).parameters
        out = method(**{k: kwargs.get(k) for k in params if k not in ("past_key_values", "inputs_embeds")},
                     **{k: None for k in ("past_key_values", "inputs_embeds") if k in params})
        if not isinstance(out, torch.Tensor):
            raise UnsupportedError(f"{owner.__name__}.{self.helper} gave no {list(self.keys)} for these inputs "
                                   f"(given: {sorted(k for k, v in kwargs.items() if v is not None)}); pass them yourself")
        return {self.prefix + self.keys[0]: out}


class ConfigOnly:
    """Stands in for a model instance to call its class's weight-free methods (``get_rope_index``,
    ``compute_3d_position_ids``) with the config alone."""

    def __init__(self, cls: type, config: Any):
        self._cls = cls
        self.config = config
        self.rope_deltas = None

    def __getattr__(self, name: str) -> Any:
        try:
            attr = getattr(self._cls, name)
        except AttributeError:
            # an attribute the instance copies from its config in __init__ (Qwen3-Omni's thinker reads
            # self.spatial_merge_size, its vision config's)
            for config in (self.config, *(v for v in vars(self.config).values() if hasattr(v, "to_dict"))):
                if name in vars(config):
                    return vars(config)[name]
            raise
        return types.MethodType(attr, self) if callable(attr) else attr


def derive(recipes: Iterable[DerivedInput], kwargs: Mapping[str, Any], config: Any = None) -> dict[str, torch.Tensor]:
    """The derived inputs ``kwargs`` lacks, from their sources in ``kwargs`` (a recipe whose source is absent or
    whose keys are all given is skipped: the caller's own precomputed tensors win; so is a model helper's without
    ``config``, whose keys the runner then reports missing)."""
    derived: dict[str, torch.Tensor] = {}
    for recipe in recipes:
        source = kwargs.get(recipe.source)
        if recipe.helper in MODEL_HELPERS and config is None:
            continue
        if isinstance(source, torch.Tensor) and any(kwargs.get(k) is None for k in recipe.names):
            derived.update({k: v for k, v in recipe.compute(kwargs, config).items() if kwargs.get(k) is None})
    return derived
