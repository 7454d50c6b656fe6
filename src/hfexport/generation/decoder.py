"""Decoder-only generation: prefill on the prompt, then the decode graph a token (or a block) at a time."""

from __future__ import annotations

from typing import Any

import torch

from .loop import Component, TextState, decode_loop

__all__ = ["generate_decoder", "decoder_session"]


def generate_decoder(exported: Any, plan: Any, inputs: dict) -> Any:
    input_ids, logits, step = decoder_session(exported, inputs, plan.gen.max_new_tokens)
    return decode_loop(plan, input_ids, logits, step)


def decoder_session(exported: Any, inputs: dict, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Run a decoder export's prefill on ``inputs`` (popped: ``input_ids``, ``attention_mask``; the rest go to every
    call); returns ``(input_ids, prefill logits, step)``, where ``step(token)`` runs the decode graph on the next
    token (chosen by ``generate``'s selector, or forced by a caller scoring the export) and returns its logits."""
    prefill, decode = Component(exported, "prefill"), Component(exported, "decode")
    input_ids = inputs.pop("input_ids")
    mask2d = inputs.pop("attention_mask", None)
    mask2d = torch.ones_like(input_ids) if mask2d is None else mask2d.long()
    window = getattr(exported.config, "sliding_window", None) if exported.config is not None else None
    text = TextState(mask2d, max_new_tokens, decode.cache_capacity(), window)
    prompt_len = input_ids.shape[-1]
    out = prefill.runner(**inputs, input_ids=input_ids,
                         **text.kwargs(prefill, 0, prompt_len, prefill.initial_cache(input_ids.shape[0], input_ids.device)))
    state = {"out": out, "ids": input_ids}
    # a model that keeps no cache: the decode component is the prefill's graph, run on the whole sequence so far
    rereads = decode.cache_key is None and exported.components["decode"].program is exported.components["prefill"].program

    def step(token: torch.Tensor) -> torch.Tensor:
        position = text.advance()
        if rereads:
            state["ids"] = torch.cat([state["ids"], token[:, None]], dim=-1)
            state["out"] = decode.runner(**inputs, input_ids=state["ids"], **text.kwargs(decode, 0, position + 1, None))
            return state["out"].logits
        cache = getattr(state["out"], decode.cache_key) if decode.cache_key else None
        state["out"] = decode.runner(**inputs, input_ids=token[:, None], **text.kwargs(decode, position, 1, cache))
        return state["out"].logits

    return input_ids, out.logits, step
