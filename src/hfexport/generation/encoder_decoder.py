"""Encoder-decoder generation (T5, Whisper): the encoder once, then the decoder's prefill and decode graphs.

The decoder starts from ``decoder_input_ids`` when the call has them (Whisper's generate passes its prompt:
start of transcript, language, task, no-timestamps), else from the generation config's decoder start token.
With ``num_beams > 1`` the encoder still runs once per prompt: its outputs, the encoder mask and the decoder prompt
are repeated per beam (eager's ``_expand_inputs_for_generation`` repeats the encoder's outputs the same way), and
:func:`.beam.beam_loop` runs the search over the decoder graphs, reordering their cache between steps.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import UnsupportedError
from ..metadata import LeafRole
from .beam import beam_loop, check_beams, reorder_cache
from .loop import Component, slot_masks, decode_loop

__all__ = ["generate_encoder_decoder", "forward_once"]

# the decoder graphs' inputs this module makes itself at each step
_DECODER_MADE = ("decoder_input_ids", "decoder_attention_mask", "encoder_outputs", "past_key_values", "use_cache",
                 "cache_position", "decoder_position_ids")


def generate_encoder_decoder(exported: Any, plan: Any, inputs: dict) -> Any:
    gen = plan.gen
    encoder, prefill, decode = (Component(exported, n) for n in ("encoder", "prefill", "decode"))
    inputs = dict(inputs)
    decoder_ids = inputs.pop("decoder_input_ids", None)
    inputs = _pad_to_cross_cache(decode, inputs)
    encoder_outputs, batch, device = _encode(encoder, inputs)
    beams = int(gen.num_beams or 1)
    if beams > 1:  # before the decoder runs: the backend, the arguments, the decoder graphs' batch
        check_beams(exported, plan, batch, prefill, decode)
    if decoder_ids is None:
        start = gen.decoder_start_token_id
        if start is None:
            raise UnsupportedError("generation_config.decoder_start_token_id is not set; pass decoder_start_token_id=")
        decoder_ids = torch.full((batch, 1), int(start), dtype=torch.long, device=device)
    # what the decoder graphs take of the call as it was given, every step, as generate's prepare_inputs_for_generation
    # passes its model kwargs: the encoder's mask for the cross-attention (T5), UDOP's layout boxes; Whisper's
    # encoder ignores the feature mask its processor may return (WhisperEncoder.forward: "preserved for
    # compatibility"), and its decoder takes none
    extra = {k: v for k, v in inputs.items() if k not in _DECODER_MADE and (k in prefill.kwargs or k in decode.kwargs)}
    if beams > 1:
        # as _expand_inputs_for_generation: each item's encoder outputs and mask repeated num_beams times (the
        # encoder ran once per item, which is what eager's expansion of its outputs equals)
        decoder_ids, extra, encoder_outputs = (_expand(x, batch, beams) for x in (decoder_ids, extra, encoder_outputs))
        batch *= beams
    prompt_len = decoder_ids.shape[-1]

    capacity = decode.cache_capacity()
    if capacity is not None and prompt_len + gen.max_new_tokens > capacity:
        raise UnsupportedError(
            f"the decoder prompt ({prompt_len}) + max_new_tokens ({gen.max_new_tokens}) exceed the exported static "
            f"decoder cache ({capacity} positions); re-export with a larger max_cache_len"
        )

    def step_kwargs(component: Component, ids: torch.Tensor, start: int, cache: Any) -> dict:
        return _decoder_call(component, ids, start, capacity, encoder_outputs, extra, cache)

    out = prefill.runner(**step_kwargs(prefill, decoder_ids, 0, prefill.initial_cache(batch, device)))
    state = {"out": out, "length": prompt_len}

    def step(token: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor:
        cache = getattr(state["out"], decode.cache_key) if decode.cache_key else None
        if order is not None:  # beam search: each row continues from its beam's
            reorder_cache(decode.runner, cache, order)
        state["out"] = decode.runner(**step_kwargs(decode, token[:, None], state["length"], cache))
        state["length"] += 1
        return state["out"].logits

    if beams > 1:
        return beam_loop(plan, decoder_ids, out.logits, step)
    # model.generate streams the decoder prompt first, as a decoder-only model's prompt: a
    # TextStreamer(skip_prompt=True) then skips exactly it
    return decode_loop(plan, decoder_ids, out.logits, step)


def _expand(tree: Any, batch: int, beams: int) -> Any:
    """Every batch-first tensor of ``tree`` with each row repeated ``beams`` times (``repeat_interleave``)."""
    return pytree.tree_map_only(
        torch.Tensor, lambda t: t.repeat_interleave(beams, 0) if t.dim() > 0 and t.shape[0] == batch else t, tree)


def _encode(encoder: Component, inputs: dict) -> tuple[Any, int, torch.device]:
    """The encoder's outputs (``encoder_outputs=`` when the call has them), the batch and the device."""
    tensors = [v for v in inputs.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    given = inputs.get("encoder_outputs")
    if given is not None:
        first = given[0] if isinstance(given, (tuple, list)) else given.last_hidden_state
        return given, first.shape[0], first.device
    if not tensors:
        raise UnsupportedError(f"generate() got no encoder input tensor: {sorted(inputs)}")
    # input_ids, input_features, input_values, pixel_values...: all batch-first
    return encoder.runner(**inputs), tensors[0].shape[0], tensors[0].device


def forward_once(exported: Any, inputs: dict, decoder_input_ids: torch.Tensor) -> Any:
    """One forward of the whole model without a kept cache (the encoder, then the prefill graph from an empty
    cache) over ``decoder_input_ids``: what Whisper's language detection and no-speech check call the model for."""
    encoder, prefill = Component(exported, "encoder"), Component(exported, "prefill")
    encoder_outputs, batch, device = _encode(encoder, {k: v for k, v in inputs.items() if k != "use_cache"})
    return prefill.runner(**_decoder_call(prefill, decoder_input_ids, 0, prefill.cache_capacity(), encoder_outputs,
                                          {}, prefill.initial_cache(batch, device)))


def _decoder_call(component: Component, ids: torch.Tensor, start: int, capacity: int | None, encoder_outputs: Any,
                  extra: dict, cache: Any) -> dict:
    """A decoder graph's kwargs for ``ids`` at positions ``start ..``: its mask (2D, or 4D slot masks over a static
    cache of ``capacity`` slots), the encoder's outputs, the cache."""
    batch, device = ids.shape[0], ids.device
    end = start + ids.shape[-1]
    call = dict(extra, decoder_input_ids=ids, encoder_outputs=encoder_outputs)
    kind = component.mask_kind("decoder_attention_mask")
    if kind == "2d":
        call["decoder_attention_mask"] = torch.ones(batch, end, dtype=torch.long, device=device)
    elif kind in ("4d", "dict"):
        valid = torch.zeros(batch, capacity or end, dtype=torch.bool, device=device)
        valid[:, :end] = True
        call["decoder_attention_mask"] = slot_masks(kind, component.mask_keys("decoder_attention_mask"), valid,
                                                     torch.arange(start, end, device=device), None)
    if component.cache_key:
        call[component.cache_key] = cache
    return call


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
