"""The step loop shared by every kind of generation: token selection (transformers' logits warpers), a component's
runner and cache, the text state (mask, positions, static-cache slots), and :func:`decode_loop`."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.utils._pytree as pytree

from ..errors import UnsupportedError
from ..metadata import KwargKind, LeafRole
from ..runner import torch_dtype

__all__ = ["TextState", "Component", "decode_loop", "eos_ids", "slot_masks", "rollback_cache"]


def eos_ids(gen: Any, device: torch.device) -> torch.Tensor | None:
    """The generation config's end-of-sequence ids as a tensor (None when it has none)."""
    eos = gen.eos_token_id
    if eos is None:
        return None
    return torch.tensor(eos if isinstance(eos, list) else [eos], dtype=torch.long, device=device)


# --- building step inputs ---------------------------------------------------------------------------------------


class Component:
    """A runner plus what its traced inputs look like."""

    def __init__(self, exported: Any, name: str):
        self.name = name
        self.runner = exported.runner(name)
        self.metadata = exported.components[name].metadata
        self.kwargs = self.metadata.kwargs

    @property
    def cache_key(self) -> str | None:
        return self.metadata.cache_kwarg

    def takes(self, key: str) -> bool:
        spec = self.kwargs.get(key)
        return spec is not None and spec.traced

    def feeds(self, key: str) -> bool:
        """Whether a call passes ``key`` (not a constant the trace specialised: a graph traced with
        ``position_ids=None`` computes its own)."""
        spec = self.kwargs.get(key)
        return spec is not None and spec.fed

    @functools.cached_property
    def picks_positions(self) -> bool:
        """Whether the graph takes the query positions its LM head projects as an input (a multi-token decode's
        ``logits_to_keep`` index, see :func:`hfexport.capture.decompose.keep_every_position`)."""
        return self.metadata.kind_of("logits_to_keep") is KwargKind.TENSOR

    def mask_kind(self, key: str = "attention_mask") -> str:
        kind = self.metadata.kind_of(key)
        if kind is KwargKind.TENSOR:
            return "2d" if self.kwargs[key].ndim == 2 else "4d"
        if kind is KwargKind.PYTREE:
            return "dict"
        return "none"

    def mask_keys(self, key: str = "attention_mask") -> list[str]:
        """The keys of a dict of masks (one per layer type: ``full_attention``, ``sliding_attention``)."""
        spec = self.metadata.kwarg_specs().get(key)
        return [str(k) for k in spec.context] if spec is not None and spec.type is dict else []

    @functools.cached_property
    def padding_mask_keys(self) -> tuple[str, ...]:
        """The keys of a dict of masks traced 2-D: a recurrent / linear-attention layer's mask (transformers'
        ``create_recurrent_attention_mask``), the 2D padding mask of the call's own tokens, not one over cache slots."""
        specs = (self.metadata.input_spec(f"attention_mask.{key}") for key in self.mask_keys())
        return tuple(s.name.split(".", 1)[1] for s in specs if s is not None and len(s.shape) == 2)

    def query_limit(self) -> int | None:
        """The most tokens one call takes on its query axis: what tracing fixed or bounded, or what the runtime
        planned memory for (an ExecuTorch program); None: no limit."""
        limit = self.metadata.query_limit()
        index = next((i for i, s in enumerate(self.metadata.inputs) if s.name == "input_ids"), None)
        planned = self.runner.planned_sizes()[index] if index is not None else None
        if planned is not None and len(planned) == 2:
            limit = planned[1] if limit is None else min(limit, planned[1])
        return limit

    def initial_cache(self, batch: int, device: torch.device | str = "cpu") -> Any:
        """An empty cache shaped like the traced one (batch from the call, the rest from the trace)."""
        key = self.cache_key
        if key is None:
            return None
        child = self.metadata.kwarg_specs()[key]
        leaves = []
        for s in self.metadata.cache_leaves():
            shape = list(s.example_shape or [d if isinstance(d, int) else 1 for d in s.shape])
            if shape and s.cache.role is not LeafRole.COUNTER:  # a layer's write position has no batch axis
                if isinstance(s.shape[0], int) and s.shape[0] != batch:
                    raise UnsupportedError(
                        f"the {self.name} graph was traced for batch {s.shape[0]} (static shapes); got batch {batch}"
                    )
                shape[0] = batch
                if not s.cache.static and s.cache.role in (LeafRole.KEYS, LeafRole.VALUES):
                    # a growing layer starts empty: its symbolic (sequence) axes hold no token yet; a decode graph
                    # that serves the prefill (a stateful OpenVINO one) takes this from the first call
                    shape = [0 if i and isinstance(d, str) else n for i, (d, n) in enumerate(zip(s.shape, shape))]
            # a leaf the trace took on the CPU beside GPU weights (a counter) stays there
            leaves.append(torch.zeros(shape, dtype=torch_dtype(s.dtype), device="cpu" if s.device == "cpu" else device))
        return pytree.tree_unflatten(leaves, child)

    def fixed_batch(self) -> int | None:
        """The batch a cache traced with static shapes pins (``None``: any batch)."""
        for s in self.metadata.cache_leaves():
            if s.shape and s.cache.role is not LeafRole.COUNTER and isinstance(s.shape[0], int):
                return int(s.shape[0])
        return None

    def cache_capacity(self) -> int | None:
        """Positions a static (self-attention) cache holds, ``None`` for a growing cache."""
        kind = self.metadata.cache_type
        part = "self_attention_cache" if kind == "EncoderDecoderCache" else None
        if kind not in ("StaticCache", "EncoderDecoderCache"):
            return None
        keys = [s for s in self.metadata.cache_leaves(LeafRole.KEYS, part=part, static=True) if s.example_shape]
        return int(keys[0].example_shape[-2]) if keys else None


def _positions(mask2d: torch.Tensor) -> torch.Tensor:
    return (mask2d.long().cumsum(-1) - 1).clamp_min(0)


def slot_masks(kind: str, keys: list[str], valid: torch.Tensor, q_slots: torch.Tensor, window: int | None) -> Any:
    """4D boolean masks ``[b, 1, q, K]`` over cache slots: causal, minus padding, minus out-of-window for sliding."""
    capacity = valid.shape[-1]
    slots = torch.arange(capacity, device=valid.device)
    causal = slots[None, :] <= q_slots[:, None]
    full = causal[None, None] & valid[:, None, None, :]
    if kind == "4d":
        return full
    masks = {}
    for key in keys:
        if "sliding" in key and window is not None:
            in_window = (q_slots[:, None] - slots[None, :]) < window
            masks[key] = full & in_window[None, None]
        else:
            masks[key] = full
    return masks


class TextState:
    """The growing state of a decoder's text: 2D mask, positions, and (static caches) which slots hold tokens.

    Buffers are allocated once for the whole generation and sliced per step, so a step allocates only its
    own small tensors.
    """

    def __init__(self, mask2d: torch.Tensor, max_new_tokens: int, capacity: int | None, window: int | None,
                 positions: torch.Tensor | None = None):
        batch, prompt_len = mask2d.shape
        total = prompt_len + max_new_tokens
        if capacity is not None and total > capacity:
            raise UnsupportedError(
                f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) exceed the exported static cache "
                f"({capacity} positions); re-export with a larger max_cache_len"
            )
        self.length = prompt_len
        device = mask2d.device
        self.mask = torch.ones(batch, total, dtype=torch.long, device=device)
        self.mask[:, :prompt_len] = mask2d
        prompt_positions = _positions(mask2d) if positions is None else positions
        self.positions = torch.cat(
            [prompt_positions, prompt_positions[..., -1:] + torch.arange(1, max_new_tokens + 1, device=device)], dim=-1
        )
        self.valid = None
        if capacity is not None:
            self.valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
            self.valid[:, :prompt_len] = mask2d.bool()
        self.window = window
        self.padded = not bool(mask2d.bool().all())
        self._kept = [torch.zeros(1, dtype=torch.long, device=device)]  # a one-token step's position index

    def kwargs(self, component: Component, start: int, q: int, cache: Any, last_only: bool = False) -> dict[str, Any]:
        """Position, mask and cache kwargs for a call on query positions ``start .. start + q``; ``last_only``: the
        caller reads the last position's logits only (a prompt's), which a graph that takes the positions to
        project is then given alone."""
        call: dict[str, Any] = {}
        if component.picks_positions:
            call["logits_to_keep"] = self._kept[0] if q == 1 else \
                torch.tensor([q - 1], device=self.mask.device) if last_only else torch.arange(q, device=self.mask.device)
        if self.padded and start == 0 and component.mask_kind() == "none":  # (an SSM's decode step needs none)
            raise UnsupportedError(
                f"this batch is padded, but the {component.name} graph takes no attention mask: its sample inputs "
                "had none with padding, so the model's code dropped the mask while tracing. Re-export with padded "
                "sample inputs (an attention_mask holding zeros) to generate padded batches, or generate one prompt "
                "at a time."
            )
        if component.feeds("position_ids"):
            call["position_ids"] = self.positions[..., start : start + q]
        if component.takes("cache_position"):
            call["cache_position"] = torch.arange(start, start + q, device=self.mask.device)
        kind = component.mask_kind()
        if kind == "2d":
            call["attention_mask"] = self.mask[:, : start + q]
        elif kind in ("4d", "dict"):
            # a growing cache's slots are the positions so far (a prefill graph traced with a prepared 4D mask)
            valid = self.valid if self.valid is not None else self.mask[:, : start + q].bool()
            call["attention_mask"] = slot_masks(
                kind, component.mask_keys(), valid, torch.arange(start, start + q, device=valid.device), self.window
            )
            for key in component.padding_mask_keys:
                call["attention_mask"][key] = self.mask[:, start : start + q]
        if component.cache_key:
            call[component.cache_key] = cache
        return call

    def rewind(self, keep: int) -> None:
        """Forget the positions from ``keep`` on (rejected drafts): their static-cache slots are free again."""
        self.length = keep
        if self.valid is not None:
            self.valid[:, keep:] = False

    def advance(self, present: torch.Tensor | None = None) -> int:
        """Account for one new token (``present``: a prompt token's mask column, 0 where it is padding); returns
        its position."""
        position = self.length
        if self.valid is not None:
            self.valid[:, position] = True if present is None else present.bool()
        self.length += 1
        return position


def rollback_cache(cache: Any, keep: int) -> None:
    """Forget a cache's positions from ``keep`` on: a growing layer is cropped (``DynamicLayer.crop``, as eager's
    assisted decoding does), a static layer's write counter goes back (the next call writes over its slots)."""
    for layer in getattr(cache, "layers", ()):
        counter = getattr(layer, "cumulative_length", None)
        if isinstance(counter, torch.Tensor) and getattr(layer, "max_cache_len", None) is not None:
            counter.fill_(keep)
        else:
            extra = int(layer.get_seq_length()) - keep
            if extra > 0:
                layer.crop(-extra)


def decode_loop(plan: Any, sequences: torch.Tensor, logits: torch.Tensor, step: Any) -> Any:
    """Pick tokens as ``GenerationMixin._sample`` does, from ``logits`` (the prefill's), until the plan's stopping
    criteria end every row; ``step(token)`` runs the next call and returns its logits. ``sequences`` holds the
    prompt (a decoder's) or the decoder start (an encoder-decoder's). Returns the sequences, or a
    ``GenerateDecoderOnlyOutput`` / ``GenerateEncoderDecoderOutput`` with ``return_dict_in_generate``."""
    gen, streamer = plan.gen, plan.streamer
    processors = plan.processors(sequences.shape[-1], sequences.device)
    criteria = plan.criteria()
    has_eos = any(hasattr(c, "eos_token_id") for c in criteria)
    pad = gen._pad_token_tensor
    pad = pad.to(sequences.device) if pad is not None else None  # once, not per step
    unfinished = torch.ones(sequences.shape[0], dtype=torch.long, device=sequences.device)
    keep = bool(gen.return_dict_in_generate)
    # as _sample keeps them: tuples, and the scores so far handed to the stopping criteria (None when not kept)
    scores: tuple | None = () if keep and gen.output_scores else None
    raw: tuple | None = () if keep and gen.output_logits else None
    if streamer is not None:
        streamer.put(sequences.cpu())
    for index in range(gen.max_new_tokens):
        next_logits = logits[:, -1, :].to(copy=True, dtype=torch.float32, device=sequences.device)
        next_scores = processors(sequences, next_logits)
        if scores is not None:
            scores += (next_scores,)
        if raw is not None:
            raw += (next_logits,)
        if gen.do_sample:
            token = torch.multinomial(torch.softmax(next_scores, dim=-1), num_samples=1).squeeze(1)
        else:
            token = torch.argmax(next_scores, dim=-1)
        if has_eos and pad is not None:
            token = token * unfinished + pad * (1 - unfinished)
        sequences = torch.cat([sequences, token[:, None]], dim=-1)
        unfinished = unfinished & ~criteria(sequences, scores).to(unfinished.device)
        if streamer is not None:
            streamer.put(token.cpu())
        if unfinished.max() == 0 or index == gen.max_new_tokens - 1:
            break
        logits = step(token)
    if streamer is not None:
        streamer.end()
    if not keep:
        return sequences
    return _output(plan, sequences, scores, raw)


def _output(plan: Any, sequences: torch.Tensor, scores: Any, logits: Any) -> Any:
    from transformers.generation.utils import GenerateDecoderOnlyOutput, GenerateEncoderDecoderOutput

    # past_key_values stays None: the cache lives in the export's runners (or its program's state)
    if plan.host.config.is_encoder_decoder:
        return GenerateEncoderDecoderOutput(sequences=sequences, scores=scores, logits=logits)
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits)
