"""Make a model and its inputs ready to trace, without changing either behind the caller's back.

:func:`prepare_for_export` returns a new inputs dict (labels stripped, output flags popped, tensors cast to the
model's dtype and device, caches copied) and the popped flags; :func:`patch_model_config` applies those flags to
the model config for the duration of the trace only.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import torch

from ..errors import UnsupportedError
from ..hf_model import OUTPUT_FLAGS, VALUE_INPUTS, label_keys
from ..pytrees import is_cache

__all__ = [
    "prepare_for_export",
    "patch_model_config",
    "check_attention_implementation",
    "register_export_input_preparer",
]

_UNEXPORTABLE_ATTENTION = ("flash_attention", "flex_attention", "paged", "kernels-community/")

_input_preparers: dict[str, Callable[[torch.nn.Module, dict], None]] = {}


def register_export_input_preparer(model_type: str) -> Callable:
    """Register ``fn(model, inputs)`` that pre-computes data-dependent kwargs for ``model_type`` before tracing.

    Example:
        >>> @register_export_input_preparer("qwen2_vl")
        ... def _grid(model, inputs):
        ...     inputs["rope_deltas"] = ...
    """

    def decorator(fn: Callable[[torch.nn.Module, dict], None]) -> Callable:
        _input_preparers[model_type] = fn
        return fn

    return decorator


def _configs(model: torch.nn.Module) -> Iterator[tuple[str, Any]]:
    config = getattr(model, "config", None)
    if config is None:
        return
    yield "config", config
    for name in getattr(config, "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if sub is not None:
            yield f"config.{name}", sub


def check_attention_implementation(model: torch.nn.Module) -> None:
    """Refuse attention implementations that no backend can export, before any tracing starts."""
    bad = []
    for where, config in _configs(model):
        impl = getattr(config, "_attn_implementation", None)
        if isinstance(impl, str) and impl.startswith(_UNEXPORTABLE_ATTENTION):
            bad.append(f"{where}._attn_implementation={impl!r}")
    if bad:
        raise UnsupportedError(
            f"{type(model).__name__} uses an attention implementation that cannot be exported ({', '.join(bad)}). "
            "Set 'sdpa' (recommended) or 'eager' before exporting: model.set_attn_implementation('sdpa'), or "
            "from_pretrained(..., attn_implementation='sdpa')."
        )


def _model_dtype_device(model: torch.nn.Module) -> tuple[torch.dtype | None, torch.device | None]:
    for p in model.parameters():
        return p.dtype, p.device
    for b in model.buffers():
        return b.dtype, b.device
    return None, None


def _cast(value: Any, dtype: torch.dtype | None, device: torch.device | None) -> Any:
    if isinstance(value, torch.Tensor):
        target_dtype = dtype if (dtype is not None and value.is_floating_point() and dtype.is_floating_point) else None
        if (target_dtype is not None and value.dtype != target_dtype) or (device is not None and value.device != device):
            return value.to(device=device, dtype=target_dtype)
        return value
    if is_cache(value):
        return copy.deepcopy(value)
    if isinstance(value, list | tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
        return type(value)(_cast(v, dtype, device) for v in value)
    return value


def prepare_for_export(
    model: torch.nn.Module, inputs: MutableMapping[str, Any]
) -> tuple[torch.nn.Module, dict[str, Any], dict[str, Any]]:
    """Configure inputs for export; returns ``(model, new_inputs, output_flags)``.

    Unlike a plain in-place prepare, neither ``model`` nor ``inputs`` is modified: the returned dict is new, caches
    in it are copies, and ``output_flags`` (``use_cache``, ``return_dict``, ...) are meant for
    :func:`patch_model_config` around the trace.

    - Strips label inputs (``labels``, ``future_values``, ...): loss computation is not exported. (An encoder-decoder
      forecaster's ``future_values`` are its decoder's input: kept.)
    - Pops output flags so they do not become traced inputs.
    - Runs the input preparer registered for the model type, if any.
    - Turns the integer tensors of :data:`~hfexport.hf_model.VALUE_INPUTS` (``image_sizes``) into Python lists: the
      models size their tensors from those values in Python, which cannot be traced symbolically (a data-dependent
      guard); as constants the export is specialised on them (and a call with other values refused by name).
    - Casts floating tensors to the model's dtype and every tensor to its device.

    Example:
        >>> model, inputs, flags = prepare_for_export(model, {"input_ids": ids, "use_cache": False})
        >>> flags
        {'use_cache': False}
    """
    if not isinstance(inputs, Mapping):
        raise TypeError(f"sample inputs must be a mapping of forward kwargs, got {type(inputs).__name__}")
    new = dict(inputs)
    labels = label_keys(getattr(model, "config", None))
    for key in list(new):
        if key in labels:
            del new[key]
    flags = {key: new.pop(key) for key in OUTPUT_FLAGS if key in new}
    flags = {key: value for key, value in flags.items() if value is not None}  # None means "the config's default"
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type in _input_preparers:
        _input_preparers[model_type](model, new)
    for key in VALUE_INPUTS.intersection(new):
        if isinstance(new[key], torch.Tensor) and not new[key].is_floating_point():
            new[key] = new[key].tolist()
    dtype, device = _model_dtype_device(model)
    new = {key: _cast(value, dtype, device) for key, value in new.items()}
    return model, new, flags


@contextlib.contextmanager
def patch_model_config(model: torch.nn.Module, flags: Mapping[str, Any]) -> Iterator[None]:
    """Set ``flags`` on ``model.config`` for the duration of the block, then restore the previous values."""
    config = getattr(model, "config", None)
    saved: list[tuple[str, bool, Any]] = []
    try:
        if config is not None:
            for key, value in flags.items():
                saved.append((key, hasattr(config, key), getattr(config, key, None)))
                setattr(config, key, value)
        yield
    finally:
        for key, existed, value in reversed(saved):
            if existed:
                setattr(config, key, value)
            else:
                with contextlib.suppress(AttributeError):
                    delattr(config, key)
