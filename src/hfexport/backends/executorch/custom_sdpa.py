"""Attention with ExecuTorch's LLM kernels for a static cache kept as state: ``llama::update_cache`` writes the step's
keys/values in place at the write position, ``llama::custom_sdpa`` attends to the written slots only.

transformers' SDPA path over a ``StaticCache`` lowers to XNNPACK in dozens of partitions per layer: the cache write
(``index_copy_``, then the write-back ``copy_``: the cache written twice), the boolean mask built over all slots,
and, for grouped heads, ``repeat_kv`` copying the whole cache to every query head, all outside the delegate; the
attention itself runs over every slot of the cache at every step. ExecuTorch ships two kernels for exactly this
(``executorch.extension.llm.custom_ops``, registered in its runtime as ``llama::update_cache.out`` and
``llama::custom_sdpa.out``): both take the cache as ``[batch, seq, kv_heads, head_dim]``, so while tracing the
cache's key/value tensors are that layout (see :func:`bshd_cache`); the runner loads and reads the state through
``transpose(1, 2)``, once per sequence (``metadata.kwargs[cache]["state_layout"] == "bshd"``).

Taken only where it is exact (:func:`custom_ops_unsupported` says why not otherwise, and the export keeps the SDPA
path): a decoder-only text model on XNNPACK whose ``StaticCache`` is kept as state, every layer a full-attention
``StaticLayer``, batch 1 (``custom_sdpa`` is causal without a padding mask: a left-padded batch cannot be
expressed), fp32, SDPA attention. An attention call the kernels cannot express while tracing (a sliding window,
soft-capping, sinks, a non-causal module, an attention that did not read our cache) raises
:class:`CustomOpsUnsupported`, and the exporter traces again on the SDPA path.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from ...metadata import LeafRole
from ...pytrees import is_cache

__all__ = [
    "CUSTOM_OPS_STATE", "CustomOpsUnsupported", "custom_ops_unsupported", "llama_custom_ops", "record_state_layout",
    "register_llama_kernels", "unpadded_causal",
    "STATE_LAYOUT",
]

STATE_LAYOUT = "bshd"
# the cache leaves kept in the program: the write counters too (to_executorch, executorch 1.5.1, numbers the outputs
# wrongly when a user input is updated beside a buffer written by llama::update_cache: the counters' outputs came
# back as the last layer's cache buffers)
CUSTOM_OPS_STATE = (LeafRole.KEYS, LeafRole.VALUES, LeafRole.COUNTER)
# attention kwargs the kernels cannot honour when set (transformers passes them through **kwargs)
_UNEXPRESSIBLE = ("sliding_window", "softcap", "s_aux", "sinks", "head_mask", "layer_head_mask", "position_bias")


class CustomOpsUnsupported(Exception):
    """An attention call met while tracing that ``llama::custom_sdpa`` cannot express exactly."""


def _text_config(model: Any) -> Any:
    config = getattr(model, "config", None)
    get_text = getattr(config, "get_text_config", None)
    return get_text() if callable(get_text) else config


def custom_ops_unsupported(model: Any, inputs: Mapping[str, Any], config: Any) -> str | None:
    """Why this export cannot take the custom-op attention (a reason), or ``None`` when it can."""
    if importlib.util.find_spec("executorch.extension.llm.custom_ops") is None:
        return "this executorch install has no executorch.extension.llm.custom_ops"
    quantizer = getattr(config, "quantizer", None)
    if quantizer is not None and not quantizer.quantizes_module:  # one of the eager module quantized it before
        return "a quantizer calibrates the traced graph on caches in the caller's [batch, heads, seq, dim] layout"
    model_config = getattr(model, "config", None)
    text = _text_config(model)
    if model_config is None or text is not model_config or getattr(model_config, "is_encoder_decoder", False):
        return "not a decoder-only text model"
    if getattr(model_config, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(model_config, '_attn_implementation', None)!r}, not 'sdpa'"
    caches = [v for v in inputs.values() if is_cache(v)]
    if len(caches) != 1 or type(caches[0]).__name__ != "StaticCache":
        return "no single StaticCache input"
    layers = getattr(caches[0], "layers", None) or []
    if not layers or any(type(layer).__name__ != "StaticLayer" for layer in layers):
        return "the cache has layers other than full-attention StaticLayer (a sliding window)"
    keys = [getattr(layer, "keys", None) for layer in layers]
    if any(not isinstance(k, torch.Tensor) or k.dim() != 4 for k in keys):
        return "the cache's layers are not initialised"
    if keys[0].shape[0] != 1:
        return f"batch {keys[0].shape[0]}: custom_sdpa is causal without a padding mask"
    if any(k.dtype != torch.float32 for k in keys):
        return f"cache dtype {keys[0].dtype}, not float32"
    if not unpadded_causal(inputs.get("attention_mask")):
        return "the sample's attention mask pads (or is not causal)"
    if getattr(text, "sliding_window", None) is not None and any(
        t != "full_attention" for t in (getattr(text, "layer_types", None) or ["sliding"])
    ):
        return "the model uses a sliding window"
    for name in ("attn_logit_softcapping", "attention_logit_softcapping"):
        if getattr(text, name, None) is not None:
            return f"{name} is set"
    return None


def unpadded_causal(mask: Any) -> bool:
    """Whether ``mask`` says what ``custom_sdpa(is_causal=True)`` computes: a 2D mask of ones, or a 4D slot mask
    ``[b, 1, q, slots]`` whose rows are prefixes of the slots, one slot longer per query row (no padding)."""
    if mask is None:
        return True
    if not isinstance(mask, torch.Tensor):
        return False  # one mask per attention kind (a sliding window): not this path
    if mask.dim() == 2:
        return bool(mask.bool().all())
    if mask.dim() != 4:
        return False
    mask = mask.bool()
    counts = mask.sum(-1)  # [b, 1, q]
    prefix = torch.arange(mask.shape[-1]) < counts[..., None]
    return bool(torch.equal(mask, prefix)) and bool((counts.diff(dim=-1) == 1).all()) and bool((counts > 0).all())


def register_llama_kernels() -> None:
    """Register ``llama::update_cache`` / ``llama::custom_sdpa`` (their ATen ops and, in the ExecuTorch runtime,
    their ``.out`` kernels: a program using them fails to load its method without, error 0x14), and ExecuTorch's
    quantized kernels (``quantized_decomposed::embedding_byte.out``, ``embedding_4bit.out``, ...: a quantized
    embedding outside the delegate; the pip runtime registers them only when this module is imported)."""
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    import executorch.kernels.quantized  # noqa: F401


def bshd_cache(cache: Any) -> Any:
    """A copy of a ``StaticCache`` whose layers hold their keys/values as contiguous ``[batch, seq, heads, dim]``."""
    copied = copy.deepcopy(cache)
    for layer in copied.layers:
        layer.keys = layer.keys.transpose(1, 2).contiguous()
        layer.values = layer.values.transpose(1, 2).contiguous()
    return copied


@contextlib.contextmanager
def llama_custom_ops(inputs: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """While tracing: every ``StaticLayer.update`` writes with ``llama::update_cache`` into its ``[B, S, H, D]``
    tensors, and SDPA attention runs ``llama::custom_sdpa`` on them. Yields the inputs to trace (the cache replaced
    by its ``[B, S, H, D]`` copy); a call it cannot express raises :class:`CustomOpsUnsupported`."""
    register_llama_kernels()
    from transformers import cache_utils
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    starts: dict[int, Any] = {}  # id(cache keys tensor) -> the write position of this step

    def update(layer: Any, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        length = key_states.shape[-2]
        start = layer.cumulative_length.item()
        torch._check(start >= 0)
        torch._check(start + length <= layer.keys.shape[1])
        layer.cumulative_length.add_(length)
        torch.ops.llama.update_cache(key_states.transpose(1, 2), layer.keys, start)
        torch.ops.llama.update_cache(value_states.transpose(1, 2), layer.values, start)
        starts[id(layer.keys)] = start
        return layer.keys, layer.values

    def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                  dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None, **kwargs: Any):
        start = starts.get(id(key))
        problems = [f"{k}={kwargs[k]!r}" for k in _UNEXPRESSIBLE if kwargs.get(k) is not None]
        if start is None:
            problems.append("its keys are not the static cache's")
        if dropout:
            problems.append(f"dropout={dropout}")
        if is_causal is False or getattr(module, "is_causal", True) is False:
            problems.append("a non-causal attention")
        if query.dtype != key.dtype:
            problems.append(f"query {query.dtype} vs cache {key.dtype}")
        if problems:
            raise CustomOpsUnsupported(f"{type(module).__name__}: " + ", ".join(problems))
        out = torch.ops.llama.custom_sdpa(query.transpose(1, 2), key, value, start, None, 0.0, True, scaling)
        return out, None  # [B, q, H, D], as transformers' sdpa_attention_forward returns it

    traced = {k: bshd_cache(v) if is_cache(v) else v for k, v in inputs.items()}
    original_update = cache_utils.StaticLayer.update
    had_local = "sdpa" in ALL_ATTENTION_FUNCTIONS._local_mapping
    previous = ALL_ATTENTION_FUNCTIONS._local_mapping.get("sdpa")
    cache_utils.StaticLayer.update = update
    ALL_ATTENTION_FUNCTIONS._local_mapping["sdpa"] = attention
    try:
        yield traced
    finally:
        cache_utils.StaticLayer.update = original_update
        if had_local:
            ALL_ATTENTION_FUNCTIONS._local_mapping["sdpa"] = previous
        else:
            ALL_ATTENTION_FUNCTIONS._local_mapping.pop("sdpa", None)
        starts.clear()


def record_state_layout(metadata: Any) -> None:
    """Describe the cache the caller passes ([batch, heads, seq, dim], as traced: [batch, seq, heads, dim]) and mark
    the program's layout, in place: ``metadata.kwargs[cache].state_layout = "bshd"``."""
    metadata.kwargs[metadata.cache_kwarg].state_layout = STATE_LAYOUT
    for spec in metadata.cache_leaves():
        if spec.cache.role in (LeafRole.KEYS, LeafRole.VALUES):
            spec.shape = _swap(spec.shape)
            spec.example_shape = _swap(spec.example_shape) if spec.example_shape else spec.example_shape


def _swap(shape: list) -> list:
    return [shape[0], shape[2], shape[1], *shape[3:]]
