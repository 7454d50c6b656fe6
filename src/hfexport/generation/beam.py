"""Beam search for ``ExportedModel.generate(num_beams=...)`` over the exported graphs, decoder-only and
encoder-decoder alike.

:func:`beam_loop` follows transformers' vectorised beam search (``GenerationMixin._beam_search``, transformers 5.x)
step for step: the prompt (a decoder's, or an encoder-decoder's decoder prompt) comes expanded to
``batch * num_beams`` rows, each step keeps the top ``max(2, 1 + n_eos) * num_beams`` continuations of every batch
item, the stopping criteria of the call mark the finished ones, the best ``num_beams`` unfinished ones continue,
finished ones enter the hypotheses with the length penalty, and the same early-stop heuristic ends the loop. Only
the step differs between the two kinds: the caller's ``step(token, order)`` reorders the cache rows to follow their
beams (:func:`reorder_cache`: a stateful runner is told the new order through ``runner.reorder``, OpenVINO applies
it in-graph through ``beam_idx``, ExecuTorch in the method's buffers; a cache handed back as tensors is reordered in
place) and runs the decode graph on the chosen tokens.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from ..errors import UnsupportedError
from ..pytrees import tensor_leaves
from .loop import Component, TextState, eos_ids

__all__ = ["generate_beam", "beam_loop", "check_beams", "reorder_cache"]

# backends whose runners hand back the cache as tensors or reorder their own state; others are refused by name
_REORDERABLE = ("dynamo", "onnx", "openvino", "executorch")


def _gather(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    while indices.dim() < tensor.dim():
        indices = indices.unsqueeze(-1)
    return torch.take_along_dim(tensor, indices, dim=1)


def reorder_cache(runner: Any, cache: Any, beam_idx: torch.Tensor) -> None:
    """Make row ``i`` of the cache continue from row ``beam_idx[i]`` before the next call of ``runner``."""
    if getattr(runner, "stateful", False):
        runner.reorder(beam_idx)
        return
    for leaf in tensor_leaves(cache) if cache is not None else ():
        if leaf.dim() > 0 and leaf.shape[0] == beam_idx.shape[0]:
            leaf.copy_(leaf.index_select(0, beam_idx))


def _fixed_batch(component: Component) -> int | None:
    """The batch a graph was traced for with static shapes: its cache's, else its token input's (``None``: any)."""
    fixed = component.fixed_batch()
    if fixed is not None:
        return fixed
    tokens = [s for s in component.metadata.inputs if s.name in ("input_ids", "decoder_input_ids") and s.shape]
    return int(tokens[0].shape[0]) if tokens and isinstance(tokens[0].shape[0], int) else None


def check_beams(exported: Any, plan: Any, batch: int, *decoders: Component) -> None:
    """Refuse, before the decoder runs, what this beam search cannot give: a backend whose cache cannot be reordered,
    sampling, a streamer, more sequences than beams, and decoder graphs traced for another batch than
    ``batch * num_beams``."""
    gen, streamer = plan.gen, plan.streamer
    fmt = str(getattr(exported.export_format, "value", exported.export_format))
    if fmt not in _REORDERABLE:
        raise UnsupportedError(
            f"beam search is not supported by ExportedModel.generate on the {fmt} backend: its runner cannot reorder "
            "the cache between steps; use num_beams=1"
        )
    if gen.do_sample or streamer is not None or (gen.num_return_sequences or 1) > gen.num_beams:
        raise UnsupportedError("beam search here is greedy (do_sample=False), without a streamer, and returns at most "
                               "num_beams sequences")
    beams = int(gen.num_beams)
    fixed = next((f for f in map(_fixed_batch, decoders) if f is not None and f != batch * beams), None)
    if fixed is not None:
        raise UnsupportedError(
            f"this export's graphs take a fixed batch of {fixed} rows (a cache traced with static shapes), and beam "
            f"search over {batch} prompt(s) with num_beams={beams} runs {batch * beams}: re-export with a sample "
            f"batch of {batch * beams} rows (or dynamic shapes), or use num_beams=1"
        )


def generate_beam(exported: Any, plan: Any, inputs: dict) -> Any:
    """Beam search over a decoder-only export (prefill + decode); what :func:`beam_loop` returns."""
    if "language_model" in exported.components:  # (an encoder-decoder's beams: generate_encoder_decoder)
        raise UnsupportedError("beam search over a multimodal export is not implemented (it runs on decoder-only and "
                               "encoder-decoder exports); use num_beams=1")
    if "prefill" not in exported.components or "decode" not in exported.components:
        raise UnsupportedError(f"beam search needs the components of export_for_generation, got {list(exported.components)}")
    prefill, decode = Component(exported, "prefill"), Component(exported, "decode")
    input_ids = inputs.pop("input_ids")
    check_beams(exported, plan, input_ids.shape[0], prefill, decode)
    beams = int(plan.gen.num_beams)
    mask2d = inputs.pop("attention_mask", None)
    mask2d = torch.ones_like(input_ids) if mask2d is None else mask2d.long()
    prompt_len = input_ids.shape[-1]
    input_ids, mask2d = input_ids.repeat_interleave(beams, 0), mask2d.repeat_interleave(beams, 0)
    extra = {k: v.repeat_interleave(beams, 0) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    window = getattr(exported.config, "sliding_window", None) if exported.config is not None else None
    text = TextState(mask2d, plan.gen.max_new_tokens, decode.cache_capacity(), window)
    out = prefill.runner(**extra, input_ids=input_ids, **text.kwargs(
        prefill, 0, prompt_len, prefill.initial_cache(input_ids.shape[0], input_ids.device), last_only=True))
    state = {"out": out, "ids": input_ids}
    # a model that keeps no cache: the decode component is the prefill's graph, run on each beam's whole sequence
    rereads = decode.cache_key is None and exported.components["decode"].program is exported.components["prefill"].program

    def step(token: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        position = text.advance()
        if rereads:
            state["ids"] = torch.cat([state["ids"].index_select(0, order), token[:, None]], dim=-1)
            state["out"] = decode.runner(**extra, input_ids=state["ids"], **text.kwargs(decode, 0, position + 1, None))
            return state["out"].logits
        cache = getattr(state["out"], decode.cache_key) if decode.cache_key else None
        reorder_cache(decode.runner, cache, order)
        state["out"] = decode.runner(**extra, input_ids=token[:, None], **text.kwargs(decode, position, 1, cache))
        return state["out"].logits

    plan.attention_mask = mask2d  # the expanded rows' (a repetition penalty skips each row's padding)
    return beam_loop(plan, input_ids, out.logits, step)


def beam_loop(plan: Any, prompt: torch.Tensor, logits: torch.Tensor,
              step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Any:
    """Beam search from ``prompt`` (``[batch * num_beams, prompt_len]``, each prompt repeated ``num_beams`` times)
    and ``logits`` (the prefill's); ``step(token, order)`` reorders the cache rows by ``order`` and returns the
    logits of the next call on ``token``. Returns ``[batch * num_return_sequences, length]`` ids as
    ``model.generate`` does, or with ``return_dict_in_generate`` a ``GenerateBeamDecoderOnlyOutput`` /
    ``GenerateBeamEncoderDecoderOutput`` (``sequences_scores`` and the per-step ``scores`` of every beam with
    ``output_scores``, the raw ``logits`` with ``output_logits``, ``beam_indices``)."""
    gen = plan.gen
    beams, returned = int(gen.num_beams), int(gen.num_return_sequences or 1)
    rows, prompt_len = prompt.shape
    batch, dev = rows // beams, prompt.device
    max_length = prompt_len + gen.max_new_tokens
    eos = eos_ids(gen, dev)
    pad = gen.pad_token_id
    fill = (pad if pad else int(eos[0])) if eos is not None else -1  # as transformers fills unused positions
    keep = max(2, 1 + (eos.numel() if eos is not None else 0)) * beams
    top_mask = torch.cat([torch.ones(beams, dtype=torch.bool, device=dev), torch.zeros(keep - beams, dtype=torch.bool, device=dev)])
    running = torch.full((batch, beams, max_length), fill, dtype=torch.long, device=dev)
    running[:, :, :prompt_len] = prompt.view(batch, beams, prompt_len)
    sequences = running.clone()
    running_scores = torch.zeros(batch, beams, device=dev)
    running_scores[:, 1:] = -1e9
    scores = torch.full((batch, beams), -1e9, device=dev)
    finished = torch.zeros(batch, beams, dtype=torch.bool, device=dev)
    improvable = torch.ones(batch, 1, dtype=torch.bool, device=dev)
    running_idx = torch.full((batch, beams, max_length - prompt_len), -1, dtype=torch.int32, device=dev)
    beam_indices = running_idx.clone()
    penalty = 1.0 if gen.length_penalty is None else gen.length_penalty  # transformers' defaults
    early = False if gen.early_stopping is None else gen.early_stopping
    offset = torch.arange(batch, device=dev).view(-1, 1) * beams
    cur_len = prompt_len
    processors = plan.processors(prompt_len, dev)  # applied to the log-probabilities, as _beam_search does
    criteria = plan.criteria()
    keep_dict = bool(gen.return_dict_in_generate)
    step_scores: list[torch.Tensor] = []
    raw: list[torch.Tensor] = []
    while True:
        logits = logits[:, -1, :].to(dtype=torch.float32, device=dev)
        log_probs = torch.log_softmax(logits, dim=-1)
        if processors:
            log_probs = processors(running[:, :, :cur_len].reshape(rows, cur_len), log_probs)
        if keep_dict and gen.output_logits:
            raw.append(logits.clone())  # the runner may reuse its output buffer
        if keep_dict and gen.output_scores:
            step_scores.append(log_probs.clone())
        vocab = log_probs.shape[-1]
        log_probs = (log_probs.view(batch, beams, vocab) + running_scores[:, :, None]).view(batch, -1)
        top_scores, top_indices = torch.topk(log_probs, k=keep)
        from_beam = top_indices // vocab
        top_idx = _gather(running_idx, from_beam)
        top_seq = _gather(running, from_beam)
        top_seq[:, :, cur_len] = top_indices % vocab
        top_idx[:, :, cur_len - prompt_len] = (from_beam + offset).to(torch.int32)
        # the call's stopping criteria (max length, EOS, stop strings, the user's) on every continuation
        hits = criteria(top_seq[:, :, : cur_len + 1].reshape(batch * keep, -1),
                        tuple(step_scores) if keep_dict and gen.output_scores else None)
        hits = hits.to(dev).view(batch, keep)
        # the best unfinished continuations run on
        live = top_scores + hits.float() * -1.0e9
        pick = torch.topk(live, k=beams)[1]
        running, running_scores, running_idx = _gather(top_seq, pick), _gather(live, pick), _gather(top_idx, pick)
        # finished ones among the top num_beams enter the hypotheses
        just = hits & top_mask[None, :]
        final = top_scores / ((cur_len + 1 - prompt_len) ** penalty)
        final = final + (torch.all(finished, -1, keepdim=True) & (early is True)).float() * -1.0e9
        final = final + (~improvable).float() * -1.0e9 + (~just) * -1.0e9
        merged = torch.topk(torch.cat([scores, final], 1), k=beams)[1]
        sequences = _gather(torch.cat([sequences, top_seq], 1), merged)
        scores = _gather(torch.cat([scores, final], 1), merged)
        beam_indices = _gather(torch.cat([beam_indices, top_idx], 1), merged)
        finished = _gather(torch.cat([finished, just], 1), merged)
        cur_len += 1
        if early == "never" and penalty > 0.0:
            best_len = max_length - prompt_len
        else:
            best_len = cur_len - prompt_len
        best_running = running_scores[:, :1] / (best_len ** penalty)
        worst_final = torch.where(finished, scores.min(dim=1, keepdim=True)[0], -1.0e9)
        improvable = improvable & torch.any(best_running > worst_final, dim=-1, keepdim=True)
        open_beam = not (bool(finished.all()) and early is True)
        if not (bool(improvable.any()) and open_beam and not bool(hits.all())):
            break
        order = running_idx[..., cur_len - 1 - prompt_len].reshape(-1).long()
        logits = step(running[:, :, cur_len - 1].reshape(-1), order)
    sequences = sequences[:, :returned].reshape(batch * returned, -1)
    beam_indices = beam_indices[:, :returned].reshape(batch * returned, -1)
    generated = int((beam_indices + 1).bool().sum(dim=1).max())
    sequences = sequences[:, : prompt_len + generated]
    if not keep_dict:
        return sequences
    from transformers.generation.utils import GenerateBeamDecoderOnlyOutput, GenerateBeamEncoderDecoderOutput

    # as _beam_search returns it: sequences_scores only with output_scores; past_key_values stays None (the cache
    # lives in the export's runners)
    kind = GenerateBeamEncoderDecoderOutput if plan.host.config.is_encoder_decoder else GenerateBeamDecoderOnlyOutput
    return kind(
        sequences=sequences,
        sequences_scores=scores[:, :returned].reshape(-1) if gen.output_scores else None,
        scores=tuple(step_scores) if gen.output_scores else None,
        logits=tuple(raw) if gen.output_logits else None,
        beam_indices=beam_indices[:, :generated],
    )
