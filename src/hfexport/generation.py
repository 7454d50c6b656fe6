"""``ExportedModel.generate``: the decode loop over the exported components alone (no source model needed).

Each step's kwargs are rebuilt the way ``generate()`` built the ones the graphs were traced with: the next token,
the grown 2D mask (dynamic cache) or the 4D slot masks (static cache, one per attention kind), positions from the
mask, and the cache the previous step returned. Token selection reuses transformers' logits warpers.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.utils._pytree as pytree

from .errors import UnsupportedError
from .runner import torch_dtype

__all__ = ["generate"]

_GEN_KEYS = ("max_new_tokens", "eos_token_id", "pad_token_id", "do_sample", "temperature", "top_k", "top_p",
             "decoder_start_token_id", "min_new_tokens", "num_beams", "num_return_sequences", "length_penalty",
             "early_stopping")


def _generation_config(exported: Any, kwargs: dict) -> Any:
    from transformers import GenerationConfig

    base = exported.generation_config
    gen = copy.deepcopy(base) if base is not None else GenerationConfig()
    overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in _GEN_KEYS}
    explicit = kwargs.pop("generation_config", None)
    if explicit is not None:
        gen = copy.deepcopy(explicit)
    for key, value in overrides.items():
        setattr(gen, key, value)
    if gen.max_new_tokens is None:
        gen.max_new_tokens = 20
    return gen


def _eos_ids(gen: Any, device: torch.device) -> torch.Tensor | None:
    eos = gen.eos_token_id
    if eos is None:
        return None
    return torch.tensor(eos if isinstance(eos, list) else [eos], dtype=torch.long, device=device)


def _warpers(gen: Any) -> Any:
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    warpers = LogitsProcessorList()
    if gen.do_sample:
        if gen.temperature is not None and gen.temperature != 1.0:
            warpers.append(TemperatureLogitsWarper(gen.temperature))
        if gen.top_k is not None and gen.top_k != 0:
            warpers.append(TopKLogitsWarper(top_k=gen.top_k))
        if gen.top_p is not None and gen.top_p < 1.0:
            warpers.append(TopPLogitsWarper(top_p=gen.top_p))
    return warpers


class _Selector:
    """Picks the next token of every row and tracks which rows have finished."""

    def __init__(self, gen: Any, batch: int, device: torch.device):
        self.gen = gen
        self.eos = _eos_ids(gen, device)
        self.pad = gen.pad_token_id if gen.pad_token_id is not None else (int(self.eos[0]) if self.eos is not None else 0)
        self.unfinished = torch.ones(batch, dtype=torch.bool, device=device)
        self.warpers = _warpers(gen)
        self.steps = 0

    def __call__(self, sequences: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if self.eos is not None and self.steps < (self.gen.min_new_tokens or 0):
            logits = logits.index_fill(-1, self.eos, float("-inf"))  # no EOS before min_new_tokens, as eager
        self.steps += 1
        if self.gen.do_sample:
            scores = self.warpers(sequences, logits)
            token = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
        else:
            token = logits.argmax(dim=-1)
        token = torch.where(self.unfinished, token, torch.full_like(token, self.pad))
        if self.eos is not None:
            self.unfinished &= ~torch.isin(token, self.eos)
        return token


# --- building step inputs ---------------------------------------------------------------------------------------


class _Component:
    """A runner plus what its traced inputs look like."""

    def __init__(self, exported: Any, name: str):
        self.name = name
        self.runner = exported.runner(name)
        self.metadata = exported.components[name].metadata
        self.kwargs = self.metadata.kwargs

    @property
    def cache_key(self) -> str | None:
        return next((k for k, v in self.kwargs.items() if v.get("kind") == "cache"), None)

    def takes(self, key: str) -> bool:
        return key in self.kwargs and self.kwargs[key].get("kind") not in ("flag",)

    def mask_kind(self, key: str = "attention_mask") -> str:
        info = self.kwargs.get(key, {})
        if info.get("kind") == "tensor":
            return "2d" if info.get("ndim") == 2 else "4d"
        if info.get("kind") == "pytree":
            return "dict"
        return "none"

    def mask_keys(self, key: str = "attention_mask") -> list[str]:
        prefix = f"{key}."
        return [s.name[len(prefix):] for s in self.metadata.inputs if s.name.startswith(prefix)]

    def initial_cache(self, batch: int, device: torch.device | str = "cpu") -> Any:
        """An empty cache shaped like the traced one (batch from the call, the rest from the trace)."""
        key = self.cache_key
        if key is None:
            return None
        child = self.metadata.kwarg_specs()[key]
        prefix = f"{key}."
        leaves = []
        for s in self.metadata.inputs:
            if not s.name.startswith(prefix):
                continue
            shape = list(s.example_shape or [d if isinstance(d, int) else 1 for d in s.shape])
            if shape and not s.name.endswith("cumulative_length"):
                if isinstance(s.shape[0], int) and s.shape[0] != batch:
                    raise UnsupportedError(
                        f"the {self.name} graph was traced for batch {s.shape[0]} (static shapes); got batch {batch}"
                    )
                shape[0] = batch
            # a leaf the trace took on the CPU beside GPU weights (a counter) stays there
            leaves.append(torch.zeros(shape, dtype=torch_dtype(s.dtype), device="cpu" if s.device == "cpu" else device))
        return pytree.tree_unflatten(leaves, child)

    def cache_capacity(self) -> int | None:
        """Positions a static (self-attention) cache holds, ``None`` for a growing cache."""
        key = self.cache_key
        kind = self.kwargs.get(key, {}).get("type") if key else None
        if kind == "StaticCache":
            prefix = f"{key}.layers."
        elif kind == "EncoderDecoderCache" and self._static_layers(f"{key}.self_attention_cache"):
            prefix = f"{key}.self_attention_cache.layers."
        else:
            return None
        for s in self.metadata.inputs:
            if s.name.startswith(prefix) and s.name.endswith(".keys") and s.example_shape:
                return int(s.example_shape[-2])
        return None

    def _static_layers(self, prefix: str) -> bool:
        return any(s.name.startswith(prefix) and s.name.endswith("cumulative_length") for s in self.metadata.inputs)


def _positions(mask2d: torch.Tensor) -> torch.Tensor:
    return (mask2d.long().cumsum(-1) - 1).clamp_min(0)


def _slot_masks(kind: str, keys: list[str], valid: torch.Tensor, q_slots: torch.Tensor, window: int | None) -> Any:
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


def generate(exported: Any, **kwargs: Any) -> torch.Tensor:
    """Generate token ids with the exported components; returns what ``model.generate`` returns.

    Args:
        exported: An :class:`~hfexport.ExportedModel` from ``export_for_generation``.
        kwargs: The processor's output (``input_ids``, ``attention_mask``, ...) and generation arguments
            (``max_new_tokens``, ``eos_token_id``, ``pad_token_id``, ``do_sample``, ``temperature``, ``top_k``,
            ``top_p``, ``streamer``, ``generation_config``).
    """
    from .registry import runner_class_for
    from .runner import torch_single_thread

    if runner_class_for(exported.export_format).computes_with_torch:
        return _generate(exported, kwargs)
    with torch_single_thread():  # the loop's own torch ops are small; the cores are the runtime's
        return _generate(exported, kwargs)


def _generate(exported: Any, kwargs: dict[str, Any]) -> torch.Tensor:
    device = _loop_device(exported)
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) and v.device != device else v for k, v in kwargs.items()}
    streamer = kwargs.pop("streamer", None)
    gen = _generation_config(exported, kwargs)
    if getattr(gen, "num_beams", 1) not in (None, 1):
        from .generation_beam import generate_beam  # refuses, naming the backend, where the cache cannot be reordered

        return generate_beam(exported, gen, streamer, kwargs)
    if "encoder" in exported.components:
        return _generate_encoder_decoder(exported, gen, streamer, kwargs)
    if "language_model" in exported.components:
        from .generation_multimodal import generate_multimodal

        return generate_multimodal(exported, gen, streamer, kwargs)
    if "prefill" not in exported.components or "decode" not in exported.components:
        raise UnsupportedError(
            f"generate() needs the components of export_for_generation; this export has {list(exported.components)}"
        )
    return _generate_decoder(exported, gen, streamer, kwargs)


def _loop_device(exported: Any) -> torch.device:
    """Where the loop keeps its tensors: where the export's runners return theirs (the first component's), like
    ``model.generate`` on ``model.device``; the caller's inputs are moved there."""
    return exported.runner(next(iter(exported.components))).output_device


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

    def kwargs(self, component: _Component, start: int, q: int, cache: Any) -> dict[str, Any]:
        """Position, mask and cache kwargs for a call on query positions ``start .. start + q``."""
        call: dict[str, Any] = {}
        if self.padded and start == 0 and component.mask_kind() == "none":  # (an SSM's decode step needs none)
            raise UnsupportedError(
                f"this batch is padded, but the {component.name} graph takes no attention mask: its sample inputs "
                "had none with padding, so the model's code dropped the mask while tracing. Re-export with padded "
                "sample inputs (an attention_mask holding zeros) to generate padded batches, or generate one prompt "
                "at a time."
            )
        if component.takes("position_ids"):
            call["position_ids"] = self.positions[..., start : start + q]
        if component.takes("cache_position"):
            call["cache_position"] = torch.arange(start, start + q, device=self.mask.device)
        kind = component.mask_kind()
        if kind == "2d":
            call["attention_mask"] = self.mask[:, : start + q]
        elif kind in ("4d", "dict"):
            # a growing cache's slots are the positions so far (a prefill graph traced with a prepared 4D mask)
            valid = self.valid if self.valid is not None else self.mask[:, : start + q].bool()
            call["attention_mask"] = _slot_masks(
                kind, component.mask_keys(), valid, torch.arange(start, start + q, device=valid.device), self.window
            )
        if component.cache_key:
            call[component.cache_key] = cache
        return call

    def advance(self) -> int:
        """Account for one new token; returns its position."""
        position = self.length
        if self.valid is not None:
            self.valid[:, position] = True
        self.length += 1
        return position


def decode_loop(gen: Any, streamer: Any, sequences: torch.Tensor, logits: torch.Tensor,
                step: Any, stream_prompt: bool = True) -> torch.Tensor:
    """Pick tokens until EOS on every row or ``max_new_tokens``; ``step(token)`` runs the next call -> logits."""
    selector = _Selector(gen, sequences.shape[0], sequences.device)
    if streamer is not None and stream_prompt:
        streamer.put(sequences.cpu())
    for index in range(gen.max_new_tokens):
        token = selector(sequences, logits[:, -1, :])
        sequences = torch.cat([sequences, token[:, None]], dim=-1)
        if streamer is not None:
            streamer.put(token.cpu())
        if not selector.unfinished.any() or index == gen.max_new_tokens - 1:
            break
        logits = step(token)
    if streamer is not None:
        streamer.end()
    return sequences


def _generate_decoder(exported: Any, gen: Any, streamer: Any, inputs: dict) -> torch.Tensor:
    input_ids, logits, step = decoder_session(exported, inputs, gen.max_new_tokens)
    return decode_loop(gen, streamer, input_ids, logits, step)


def decoder_session(exported: Any, inputs: dict, max_new_tokens: int) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Run a decoder export's prefill on ``inputs`` (popped: ``input_ids``, ``attention_mask``; the rest go to every
    call); returns ``(input_ids, prefill logits, step)``, where ``step(token)`` runs the decode graph on the next
    token (chosen by ``generate``'s selector, or forced by a caller scoring the export) and returns its logits."""
    prefill, decode = _Component(exported, "prefill"), _Component(exported, "decode")
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


def _generate_encoder_decoder(exported: Any, gen: Any, streamer: Any, inputs: dict) -> torch.Tensor:
    encoder, prefill, decode = (_Component(exported, n) for n in ("encoder", "prefill", "decode"))
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

    def step_kwargs(component: _Component, ids: torch.Tensor, start: int, cache: Any) -> dict:
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
            call["decoder_attention_mask"] = _slot_masks(kind, component.mask_keys("decoder_attention_mask"), valid,
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

    sequences = decode_loop(gen, streamer, decoder_ids, out.logits, step, stream_prompt=False)
    if exported.components["prefill"].metadata.architecture in _RETURNS_NEW_TOKENS_ONLY:
        return sequences[:, 1:]
    return sequences


def _pad_to_cross_cache(component: _Component, inputs: dict) -> dict:
    """A static cross-attention cache pins the encoder length: right-pad the encoder inputs to it, masked out."""
    key = component.cache_key
    cross = f"{key}.cross_attention_cache."
    lengths = [s.example_shape[-2] for s in component.metadata.inputs
               if s.name.startswith(cross) and s.name.endswith(".keys") and s.example_shape]
    ids, mask = inputs.get("input_ids"), inputs.get("attention_mask")
    if ids is None or not lengths or not component._static_layers(cross.rstrip(".")):
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


# generate() of these drops the decoder prompt and returns only the new tokens
_RETURNS_NEW_TOKENS_ONLY = ("WhisperForConditionalGeneration",)
