"""Assisted decoding: drafts from the sequence itself (``prompt_lookup_num_tokens=``) or from an assistant model
(``assistant_model=``, an eager model or another export), verified in one call of the multi-token decode graph per
block.

It follows ``GenerationMixin._assisted_decoding`` (transformers 5.x) step for step, with transformers' own
``PromptLookupCandidateGenerator`` / ``AssistedCandidateGenerator`` proposing the drafts: each call of the multi-token decode graph (what
``multi_token_decode=True`` exports it for) takes the newest token and the drafts after it, the logits processors run
on every position, the drafts are kept up to the first one the model would not have picked, plus the model's own next
token. The cache then forgets the rejected drafts: a growing cache is cropped (``DynamicCache.crop``, as eager does),
a static one marks their slots free (the next call writes over them). Greedy tokens equal eager's, and so do sampled
ones for the same seed (the same ``multinomial`` calls in the same order; an assistant's drafts are sampled with
transformers' ``_speculative_sampling``). An exported assistant drafts through :class:`~.drafts.ExportedAssistant`,
which answers the generator's ``assistant_model.generate`` calls with its own graphs and cache. With
``return_dict_in_generate`` it returns eager's ``GenerateDecoderOnlyOutput``: a score (processed) and a raw logit row
per kept token.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..errors import UnsupportedError
from .drafts import ExportedAssistant, is_exported, refuse_stateful
from .loop import Component, TextState, rollback_cache

__all__ = ["generate_assisted"]


def _check(exported: Any, decode: Component, input_ids: torch.Tensor, plan: Any) -> None:
    assistant = plan.assistant_model
    if assistant is not None and not is_exported(assistant) and \
            not (isinstance(assistant, torch.nn.Module) and hasattr(assistant, "generate")):
        raise UnsupportedError(
            f"assistant_model= takes an eager transformers model or an ExportedModel (got {type(assistant).__name__})")
    if "prefill" not in exported.components or "encoder" in exported.components or \
            "language_model" in exported.components:
        raise UnsupportedError("assisted decoding runs on decoder-only exports (prefill + decode)")
    spec = decode.metadata.input_spec("input_ids")
    if spec is None or len(spec.shape) < 2 or isinstance(spec.shape[-1], int) and spec.shape[-1] == 1:
        raise UnsupportedError(
            "assisted decoding verifies a block of drafted tokens in one call, and this export's decode graph "
            "takes one token: re-export with multi_token_decode=True (and dynamic=True)"
        )
    refuse_stateful(exported, "this export",
                    "export with stateful=False, or drop prompt_lookup_num_tokens= / assistant_model=")
    if input_ids.shape[0] != 1:
        raise UnsupportedError("assisted generate is only supported for batch_size = 1 (as in model.generate)")


def _candidate_generator(exported: Any, plan: Any, input_ids: torch.Tensor, mask2d: torch.Tensor,
                         processors: Any) -> Any:
    """The drafts' source, as ``GenerationMixin._get_candidate_generator`` builds it."""
    from transformers.generation.candidate_generator import (
        AssistedCandidateGenerator,
        PromptLookupCandidateGenerator,
    )

    gen = plan.gen
    if gen.prompt_lookup_num_tokens is not None:
        text_config = exported.config.get_text_config() if exported.config is not None else None
        return PromptLookupCandidateGenerator(
            eos_token_id=gen._eos_token_tensor, num_output_tokens=gen.prompt_lookup_num_tokens,
            max_matching_ngram_size=gen.max_matching_ngram_size or 2, max_length=gen.max_length,
            logits_processor=processors, vocab_size=getattr(text_config, "vocab_size", None),
        )
    # the export's cache settings describe its own graphs; the eager assistant drafts with its growing cache, as the
    # eager main model's config would have it (transformers refuses a static cache for assisted decoding)
    drafting = copy.deepcopy(gen)
    drafting.cache_implementation, drafting.max_cache_len = None, None
    assistant = plan.assistant_model
    if is_exported(assistant):
        assistant = ExportedAssistant(assistant, gen.max_length, input_ids.device)
    return AssistedCandidateGenerator(
        input_ids=input_ids, assistant_model=assistant, generation_config=drafting,
        model_kwargs={"attention_mask": mask2d, "use_cache": True}, inputs_tensor=input_ids,
        logits_processor=processors,
    )


def _select(gen: Any, candidates: torch.Tensor, candidate_logits: Any, drafted: int,
            new_logits: torch.Tensor) -> torch.Tensor:
    """The tokens kept from a verified block (the matching drafts and the model's next), as ``_assisted_decoding``
    picks them."""
    from transformers.generation.utils import _speculative_sampling

    weight = gen.assistant_ensemble_weight
    if gen.do_sample and candidate_logits is not None:
        return _speculative_sampling(candidates, candidate_logits, drafted, new_logits,
                                     assistant_ensemble_weight=weight)[0]
    if gen.do_sample:
        selected = torch.multinomial(new_logits.softmax(dim=-1)[0], num_samples=1).squeeze(1)[None, :]
    elif weight is not None and candidate_logits is not None:
        mixed = weight * new_logits[:, :drafted].softmax(dim=-1) + (1.0 - weight) * candidate_logits.softmax(dim=-1)
        selected = torch.cat([mixed.argmax(dim=-1), new_logits[:, drafted:].argmax(dim=-1)], dim=-1)
    else:
        selected = new_logits.argmax(dim=-1)
    cur_len = candidates.shape[1] - drafted
    matches = int(((~(candidates[:, cur_len:] == selected[:, :-1])).cumsum(dim=-1) < 1).sum())
    return selected[:, : matches + 1]


def generate_assisted(exported: Any, plan: Any, inputs: dict) -> Any:
    """``model.generate(prompt_lookup_num_tokens=N)`` / ``model.generate(assistant_model=...)`` over the export's
    multi-token decode graph: the token ids, or with ``return_dict_in_generate`` a ``GenerateDecoderOnlyOutput``
    (``scores`` / ``logits`` with ``output_scores`` / ``output_logits``, one row per kept token, as
    ``_assisted_decoding`` returns them)."""
    gen = plan.gen
    prefill, decode = Component(exported, "prefill"), Component(exported, "decode")
    input_ids = inputs.pop("input_ids")
    _check(exported, decode, input_ids, plan)
    mask2d = inputs.pop("attention_mask", None)
    mask2d = torch.ones_like(input_ids) if mask2d is None else mask2d.long()
    if not bool(mask2d.bool().all()):
        raise UnsupportedError("assisted decoding takes one unpadded prompt")
    device = input_ids.device
    window = getattr(exported.config, "sliding_window", None) if exported.config is not None else None
    capacity = decode.cache_capacity()
    # drafts may run past max_length (eager verifies them, then keeps what fits): room for them where the cache has it
    room = int(gen.prompt_lookup_num_tokens or 0)  # (an assistant drafts within max_length)
    if capacity is not None:
        room = max(0, min(room, capacity - input_ids.shape[-1] - gen.max_new_tokens))
    limit = input_ids.shape[-1] + gen.max_new_tokens + room
    text = TextState(mask2d, gen.max_new_tokens + room, capacity, window)
    processors = plan.processors(input_ids.shape[-1], device)
    criteria = plan.criteria()
    generator = _candidate_generator(exported, plan, input_ids, mask2d, processors)
    eos = gen._eos_token_tensor
    cache = prefill.initial_cache(1, device)
    cached = 0  # positions the cache holds
    keep_dict = bool(gen.return_dict_in_generate)
    scores: tuple | None = () if keep_dict and gen.output_scores else None
    raw: tuple | None = () if keep_dict and gen.output_logits else None
    if plan.streamer is not None:
        plan.streamer.put(input_ids.cpu())
    while True:
        cur_len = input_ids.shape[1]
        candidates, candidate_logits = generator.get_candidates(input_ids)
        candidates = candidates.to(device)[:, :limit]  # (a static cache's last slots: fewer drafts verified)
        drafted = candidates.shape[1] - cur_len
        if candidate_logits is not None:
            candidate_logits = candidate_logits.to(device)[:, :drafted]
        if text.valid is not None:
            text.valid[:, cached: candidates.shape[1]] = True
        # the first call: the prompt through the prefill graph (which returns its last position's logits only),
        # then the drafts through the decode graph; later calls: the newest token and the drafts through decode
        calls = [(decode, cached, candidates[:, cached:])] if cached else \
            [(prefill, 0, input_ids)] + ([(decode, cur_len, candidates[:, cur_len:])] if drafted else [])
        pieces = []
        for component, start, block in calls:
            out = component.runner(**inputs, input_ids=block,
                                   **text.kwargs(component, start, block.shape[1], cache, last_only=component is prefill))
            cache = getattr(out, decode.cache_key)
            pieces.append(out.logits[:, -block.shape[1]:])
        new_logits = torch.cat(pieces, dim=1)[:, -drafted - 1:].to(dtype=torch.float32, device=device)
        unprocessed = new_logits.clone() if raw is not None else None
        for i in range(drafted + 1):
            new_logits[:, i, :] = processors(candidates[:, : cur_len + i], new_logits[:, i, :])
        valid = _select(gen, candidates, candidate_logits, drafted, new_logits)[:, : gen.max_length - cur_len]
        if eos is not None:
            hits = torch.isin(valid.squeeze(0), eos.to(device)).nonzero()
            if hits.numel() > 0:
                valid = valid[:, : int(hits[0]) + 1]
        matches = valid.shape[1] - 1
        input_ids = torch.cat((input_ids, valid), dim=-1)
        if plan.streamer is not None:
            plan.streamer.put(valid.cpu())
        cached = input_ids.shape[1] - 1  # the newest token is fed with the next drafts
        rollback_cache(cache, cached)
        text.rewind(cached)
        generator.update_candidate_strategy(input_ids, new_logits, matches)
        if scores is not None:
            scores += tuple(new_logits[:, i, :] for i in range(matches + 1))
        if raw is not None:
            raw += tuple(unprocessed[:, i, :] for i in range(matches + 1))
        # as _assisted_decoding calls them: with the scores kept so far (None when none are kept)
        done = criteria(input_ids, scores)
        if bool(done.all()):
            break
    if plan.streamer is not None:
        plan.streamer.end()
    _write_back(generator)
    if not keep_dict:
        return input_ids
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    # past_key_values stays None: the cache lives in the export's runners
    return GenerateDecoderOnlyOutput(sequences=input_ids, scores=scores, logits=raw)


def _write_back(generator: Any) -> None:
    """As ``_assisted_decoding`` ends: a heuristic schedule's number of drafts carries over to the assistant's next
    call (it is written into the assistant's generation config)."""
    assistant = getattr(generator, "assistant_model", None)
    config = getattr(assistant, "generation_config", None)
    if config is not None and config.num_assistant_tokens_schedule == "heuristic":
        config.num_assistant_tokens = generator.num_assistant_tokens
