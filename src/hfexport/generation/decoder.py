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
    # a model that keeps no cache: the decode component is the prefill's graph, run on the whole sequence so far
    rereads = decode.cache_key is None and exported.components["decode"].program is exported.components["prefill"].program
    # a model that keeps a cache and still reads its whole sequence at each step (CPM-Ant: its forward slices the
    # cached prefix off itself; its prepare_inputs_for_generation passes every token)
    whole = not rereads and decode.cache_key is not None and _reads_whole_sequence(decode.metadata)
    carried = _carried(decode, inputs)
    # what generate() passed the decode steps as None, the prompt's alone (Kosmos-2's image_embeds_position_mask,
    # an unsplit model's pixels): given to the prefill only
    constants = decode.metadata.in_constants
    per_step = {k: v for k, v in inputs.items() if not (k in constants and constants[k] is None and v is not None)}
    prompt_len = _prefill_length(prefill, decode, input_ids.shape[-1], rereads or not (decode.cache_key or carried))
    text.length = prompt_len
    out = prefill.runner(**inputs, input_ids=input_ids[:, :prompt_len],
                         **text.kwargs(prefill, 0, prompt_len, prefill.initial_cache(input_ids.shape[0], input_ids.device),
                                       last_only=True))
    state = {"out": out, "ids": input_ids[:, : prompt_len] if whole else input_ids}

    def step(token: torch.Tensor, prompt: bool = False) -> torch.Tensor:
        position = text.advance(mask2d[:, text.length] if prompt else None)
        if rereads:
            state["ids"] = torch.cat([state["ids"], token[:, None]], dim=-1)
            state["out"] = decode.runner(**per_step, input_ids=state["ids"],
                                         **text.kwargs(decode, 0, position + 1, None))
            return state["out"].logits
        cache = getattr(state["out"], decode.cache_key) if decode.cache_key else None
        handed = {key: getattr(state["out"], key) for key in carried} if carried else {}
        state["ids"] = torch.cat([state["ids"], token[:, None]], dim=-1) if whole else state["ids"]
        state["out"] = decode.runner(**per_step, **handed, input_ids=state["ids"] if whole else token[:, None],
                                     **text.kwargs(decode, position, 1, cache))
        return state["out"].logits

    logits = out.logits
    for index in range(prompt_len, input_ids.shape[-1]):  # the prompt's tokens past a fixed prefill length
        logits = step(input_ids[:, index], prompt=True)
    return input_ids, logits, step


def _carried(decode: Component, inputs: dict) -> list[str]:
    """The decode graph's kwargs besides the cache that each call's output hands to the next (RWKV's ``state``),
    as transformers' ``_update_model_kwargs_for_generation`` carries them."""
    returned = {s.name.split(".")[0] for s in decode.metadata.user_outputs}
    return [key for key in decode.kwargs if decode.takes(key) and key in returned and key != decode.cache_key
            and key not in inputs]


def _prefill_length(prefill: Component, decode: Component, prompt_len: int, whole: bool) -> int:
    """How many of the prompt's tokens the prefill graph takes: all of them, unless tracing fixed or bounded its
    sequence axis at fewer (a model whose code loops over the sequence in Python: a recurrent scan, Mamba's slow
    path) or its runtime planned memory for fewer (ExecuTorch); then it takes that many and the decode graph the
    rest, one token a call, each updating the cache as a generated token would (how recurrent runtimes prefill).
    ``whole``: the graphs hand no state on, or the decode graph rereads the sequence: the prefill takes it all."""
    if whole:
        return prompt_len
    fixed = prefill.query_limit()
    if fixed is None or fixed >= prompt_len:
        return prompt_len
    step_axis = decode.metadata.query_axis(("input_ids",))
    return prompt_len if isinstance(step_axis, int) and step_axis != 1 else fixed


def _reads_whole_sequence(metadata: Any) -> bool:
    """Whether a decode graph that takes a cache was traced with ``input_ids`` as long as its ``attention_mask``:
    the whole sequence so far, not the new tokens (a step's mask covers the cache and the new tokens, so only a model
    that reads every token again gives it the mask's length)."""
    ids, mask = metadata.input_spec("input_ids"), metadata.input_spec("attention_mask")
    if ids is None or mask is None:
        return False
    ids_shape, mask_shape = (ids.example_shape or ids.shape), (mask.example_shape or mask.shape)
    return (len(ids_shape) == 2 and len(mask_shape) == 2 and isinstance(ids_shape[-1], int)
            and ids_shape[-1] > 1 and ids_shape[-1] == mask_shape[-1])
