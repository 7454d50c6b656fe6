"""Prompt-lookup decoding (``prompt_lookup_num_tokens=``): drafts from the sequence itself, verified in one call.

It follows ``GenerationMixin._assisted_decoding`` (transformers 5.x) step for step, with transformers' own
``PromptLookupCandidateGenerator`` proposing the drafts: each call of the multi-token decode graph (what
``multi_token_decode=True`` exports it for) takes the newest token and the drafts after it, the logits processors run
on every position, the drafts are kept up to the first one the model would not have picked, plus the model's own next
token. The cache then forgets the rejected drafts: a growing cache is cropped (``DynamicCache.crop``, as eager does),
a static one marks their slots free (the next call writes over them). Greedy tokens equal eager's, and so do sampled
ones for the same seed (the same ``multinomial`` calls in the same order).
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedError
from .loop import Component, TextState

__all__ = ["generate_prompt_lookup"]


def _check(exported: Any, decode: Component, input_ids: torch.Tensor, plan: Any) -> None:
    if "prefill" not in exported.components or "encoder" in exported.components or \
            "language_model" in exported.components:
        raise UnsupportedError("prompt lookup decoding runs on decoder-only exports (prefill + decode)")
    spec = decode.metadata.input_spec("input_ids")
    if spec is None or len(spec.shape) < 2 or isinstance(spec.shape[-1], int) and spec.shape[-1] == 1:
        raise UnsupportedError(
            "prompt lookup decoding verifies a block of drafted tokens in one call, and this export's decode graph "
            "takes one token: re-export with multi_token_decode=True (and dynamic=True)"
        )
    for name in ("prefill", "decode"):
        if getattr(exported.runner(name), "stateful", False):
            raise UnsupportedError(
                "prompt lookup decoding rolls the cache back past rejected drafts, and this export keeps its cache "
                "inside the runtime (stateful), out of reach: export with stateful=False, or drop "
                "prompt_lookup_num_tokens")
    if input_ids.shape[0] != 1:
        raise UnsupportedError("assisted generate is only supported for batch_size = 1 (as in model.generate)")
    if plan.gen.return_dict_in_generate:
        raise UnsupportedError("prompt lookup decoding here returns the sequences only; drop return_dict_in_generate")


def _rollback(cache: Any, keep: int) -> None:
    """Forget the cache's positions from ``keep`` on: a growing layer is cropped, a static layer's write counter
    goes back (its slots are written over by the next call)."""
    for layer in getattr(cache, "layers", ()):
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor) and getattr(layer, "max_cache_len", None) is not None:
            counter.fill_(keep)
        else:
            extra = int(layer.get_seq_length()) - keep
            if extra > 0:
                layer.crop(-extra)


def generate_prompt_lookup(exported: Any, plan: Any, inputs: dict) -> torch.Tensor:
    """``model.generate(prompt_lookup_num_tokens=N)`` over the export's multi-token decode graph."""
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    gen = plan.gen
    prefill, decode = Component(exported, "prefill"), Component(exported, "decode")
    input_ids = inputs.pop("input_ids")
    _check(exported, decode, input_ids, plan)
    mask2d = inputs.pop("attention_mask", None)
    mask2d = torch.ones_like(input_ids) if mask2d is None else mask2d.long()
    if not bool(mask2d.bool().all()):
        raise UnsupportedError("prompt lookup decoding takes one unpadded prompt")
    device = input_ids.device
    window = getattr(exported.config, "sliding_window", None) if exported.config is not None else None
    capacity = decode.cache_capacity()
    text = TextState(mask2d, gen.max_new_tokens, capacity, window)
    processors = plan.processors(input_ids.shape[-1], device)
    criteria = plan.criteria()
    text_config = exported.config.get_text_config() if exported.config is not None else None
    generator = PromptLookupCandidateGenerator(
        eos_token_id=gen._eos_token_tensor, num_output_tokens=gen.prompt_lookup_num_tokens,
        max_matching_ngram_size=gen.max_matching_ngram_size or 2, max_length=gen.max_length,
        logits_processor=processors, vocab_size=getattr(text_config, "vocab_size", None),
    )
    eos = gen._eos_token_tensor
    cache = prefill.initial_cache(1, device)
    cached = 0  # positions the cache holds: the first call is the prefill graph's (the prompt and its drafts)
    if plan.streamer is not None:
        plan.streamer.put(input_ids.cpu())
    while True:
        cur_len = input_ids.shape[1]
        candidates, _ = generator.get_candidates(input_ids)
        candidates = candidates.to(device)
        drafted = candidates.shape[1] - cur_len
        block = candidates[:, cached:]
        if text.valid is not None:
            text.valid[:, cached: candidates.shape[1]] = True
        component = prefill if cached == 0 else decode
        out = component.runner(**inputs, input_ids=block, **text.kwargs(component, cached, block.shape[1], cache))
        cache = getattr(out, decode.cache_key)
        new_logits = out.logits[:, -drafted - 1:].to(dtype=torch.float32, device=device)
        for i in range(drafted + 1):
            new_logits[:, i, :] = processors(candidates[:, : cur_len + i], new_logits[:, i, :])
        if gen.do_sample:
            selected = torch.multinomial(new_logits.softmax(dim=-1)[0], num_samples=1).squeeze(1)[None, :]
        else:
            selected = new_logits.argmax(dim=-1)
        matches = int(((~(candidates[:, cur_len:] == selected[:, :-1])).cumsum(dim=-1) < 1).sum())
        valid = selected[:, : matches + 1][:, : gen.max_length - cur_len]
        if eos is not None:
            hits = torch.isin(valid.squeeze(0), eos.to(device)).nonzero()
            if hits.numel() > 0:
                valid = valid[:, : int(hits[0]) + 1]
        matches = valid.shape[1] - 1
        input_ids = torch.cat((input_ids, valid), dim=-1)
        if plan.streamer is not None:
            plan.streamer.put(valid.cpu())
        cached = input_ids.shape[1] - 1  # the newest token is fed with the next drafts
        _rollback(cache, cached)
        if text.valid is not None:
            text.valid[:, cached:] = False
        generator.update_candidate_strategy(input_ids, new_logits, matches)
        done = criteria(input_ids, new_logits[:, matches, :])
        if bool(done.all()):
            break
    if plan.streamer is not None:
        plan.streamer.end()
    return input_ids
