"""Encoder-decoder generation (T5, Whisper): the encoder once, then the decoder's prefill and decode graphs."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedError
from ..metadata import LeafRole
from .loop import Component, slot_masks, decode_loop

__all__ = ["generate_encoder_decoder"]

# generate() of these drops the decoder prompt and returns only the new tokens
_RETURNS_NEW_TOKENS_ONLY = ("WhisperForConditionalGeneration",)


def generate_encoder_decoder(exported: Any, plan: Any, inputs: dict) -> Any:
    gen = plan.gen
    encoder, prefill, decode = (Component(exported, n) for n in ("encoder", "prefill", "decode"))
    inputs = _pad_to_cross_cache(decode, inputs)
    encoder_outputs = encoder.runner(**inputs)
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    if not tensors:
        raise UnsupportedError(f"generate() got no encoder input tensor: {sorted(inputs)}")
    batch = tensors[0].shape[0]  # input_ids, input_features, input_values, pixel_values...: all batch-first
    device = tensors[0].device
    start = gen.decoder_start_token_id
    if start is None:
        raise UnsupportedError("generation_config.decoder_start_token_id is not set; pass decoder_start_token_id=")
    decoder_ids = torch.full((batch, 1), int(start), dtype=torch.long, device=device)
    extra = {k: v for k, v in inputs.items() if k == "attention_mask"}

    capacity = decode.cache_capacity()
    if capacity is not None and 1 + gen.max_new_tokens > capacity:
        raise UnsupportedError(
            f"max_new_tokens ({gen.max_new_tokens}) exceeds the exported static decoder cache ({capacity} positions); "
            "re-export with a larger max_cache_len"
        )

    def step_kwargs(component: Component, ids: torch.Tensor, start: int, cache: Any) -> dict:
        call = dict(extra)
        call["decoder_input_ids"] = ids
        call["encoder_outputs"] = encoder_outputs
        kind = component.mask_kind("decoder_attention_mask")
        if kind == "2d":
            call["decoder_attention_mask"] = torch.ones(batch, start + ids.shape[-1], dtype=torch.long, device=device)
        elif kind in ("4d", "dict"):
            valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
            valid[:, : start + ids.shape[-1]] = True
            q_slots = torch.arange(start, start + ids.shape[-1], device=device)
            call["decoder_attention_mask"] = slot_masks(kind, component.mask_keys("decoder_attention_mask"), valid,
                                                         q_slots, None)
        if component.cache_key:
            call[component.cache_key] = cache
        return call

    out = prefill.runner(**step_kwargs(prefill, decoder_ids, 0, prefill.initial_cache(batch, device)))
    state = {"out": out, "length": 1}

    def step(token: torch.Tensor) -> torch.Tensor:
        cache = getattr(state["out"], decode.cache_key) if decode.cache_key else None
        state["out"] = decode.runner(**step_kwargs(decode, token[:, None], state["length"], cache))
        state["length"] += 1
        return state["out"].logits

    # model.generate streams the decoder prompt (the start token) first, as a decoder-only model's prompt: a
    # TextStreamer(skip_prompt=True) then skips exactly it
    sequences = decode_loop(plan, decoder_ids, out.logits, step)
    if isinstance(sequences, torch.Tensor) and \
            exported.components["prefill"].metadata.architecture in _RETURNS_NEW_TOKENS_ONLY:
        return sequences[:, 1:]
    return sequences


def _pad_to_cross_cache(component: Component, inputs: dict) -> dict:
    """A static cross-attention cache pins the encoder length: right-pad the encoder inputs to it, masked out."""
    lengths = [s.example_shape[-2] for s in component.metadata.cache_leaves(
        LeafRole.KEYS, part="cross_attention_cache", static=True) if s.example_shape]
    ids, mask = inputs.get("input_ids"), inputs.get("attention_mask")
    if ids is None or not lengths:
        return inputs
    target = int(lengths[0])
    extra = target - ids.shape[-1]
    if extra < 0:
        raise UnsupportedError(
            f"the encoder input has {ids.shape[-1]} tokens but the exported static cross-attention cache holds "
            f"{target}; re-export with a sample input at least that long"
        )
    if extra == 0:
        return inputs
    padded = dict(inputs)
    padded["input_ids"] = torch.cat([ids, torch.zeros((ids.shape[0], extra), dtype=ids.dtype, device=ids.device)], dim=-1)
    mask = torch.ones_like(ids) if mask is None else mask
    padded["attention_mask"] = torch.cat([mask, torch.zeros((mask.shape[0], extra), dtype=mask.dtype, device=mask.device)], dim=-1)
    return padded
