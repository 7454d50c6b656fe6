"""Split a generative model into the graphs generation needs, by watching one real ``model.generate()``.

``generate`` already knows how every architecture prepares its inputs (caches, masks, positions, encoder outputs),
so instead of re-implementing that per model we run it once for two (or three) new tokens and record the kwargs
of each ``forward`` call: the first is the prefill, the next the single-token decode; with ``multi_token_decode``
two decode calls are merged into one whose query axis stays symbolic.

Caches are built here rather than by ``generate``: sliding-window layers become full-length layers (the sliding
mask still applies the window), because the sliding layers' Python-int bookkeeping cannot be traced.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import UnsupportedError
from ..pytrees import is_cache
from .recorder import GENERATE_HINTS, CallRecorder

__all__ = ["decompose_prefill_decode", "full_attention_cache", "keep_every_position", "merge_decode_calls"]

_SEQ_KEYS = ("input_ids", "decoder_input_ids", "position_ids", "decoder_position_ids", "inputs_embeds",
             "decoder_inputs_embeds", "cache_position")
_MASK_KEYS = ("attention_mask", "decoder_attention_mask")


def full_attention_cache(cache: Any, max_cache_len: int | None = None) -> Any:
    """Replace the sliding-window layers of a cache by full-length layers of the same kind (in place).

    ``max_cache_len`` is the length of the full static layers (required when the cache is static). A hybrid layer
    (linear attention beside a sliding window, Inkling's ``hybrid_sliding``) keeps its linear-attention states: it
    becomes transformers' linear-attention-and-full-attention layer with as many states, not a bare KV layer (its
    conv state would be gone: "Cannot get conv state for non linear attention layer"). A model's own subclass of a
    sliding-window layer (DeepSeek-V4's compressed-attention layers) is left as it is: a plain layer would lose its
    state and methods ("'DynamicLayer' object has no attribute 'store_compression_weights'").
    """
    from transformers import cache_utils as cu

    caches = [cache]
    for name in ("self_attention_cache", "cross_attention_cache"):
        if hasattr(cache, name):
            caches.append(getattr(cache, name))
    for c in caches:
        layers = getattr(c, "layers", None)
        if not isinstance(layers, list):
            continue
        for i, layer in enumerate(layers):
            length = max_cache_len or getattr(layer, "max_cache_len", None)
            kind = type(layer)  # exact types: a model's own subclass (DeepSeek-V4's compressor layers) keeps its
            if kind is cu.LinearAttentionAndStaticSlidingWindowAttentionLayer:  # state and methods, and stays
                layers[i] = cu.LinearAttentionAndStaticFullAttentionLayer(
                    max_cache_len=length, number_of_states=layer.number_of_states)
            elif kind is cu.LinearAttentionAndSlidingWindowAttentionLayer:
                layers[i] = cu.LinearAttentionAndFullAttentionLayer(number_of_states=layer.number_of_states)
            elif kind is cu.StaticSlidingWindowLayer:
                layers[i] = cu.StaticLayer(max_cache_len=length)
            elif kind is cu.DynamicSlidingWindowLayer:
                layers[i] = cu.DynamicLayer()
    return cache


def _build_cache(model: torch.nn.Module, generation_config: Any, batch: int, prompt_len: int, new_tokens: int) -> Any:
    """The cache ``generate`` would build, with sliding layers made full; ``None`` to let ``generate`` build it."""
    from transformers import DynamicCache, StaticCache

    config = model.config
    if getattr(config, "is_encoder_decoder", False):
        return _encoder_decoder_cache(config, generation_config)
    if "past_key_values" not in inspect.signature(model.forward).parameters:
        return None  # e.g. Mamba's cache_params: generate builds it, and it has no sliding layers
    if _own_cache_class(model) is not None:
        return None  # MiniMax's forward builds its MiniMaxCache and refuses any other ("uses cache of its own")
    if generation_config.cache_implementation == "static":
        max_len = generation_config.max_cache_len or (prompt_len + new_tokens)
        if max_len < prompt_len + new_tokens:
            raise UnsupportedError(
                f"max_cache_len={max_len} cannot hold the capture's prompt ({prompt_len}) plus {new_tokens} tokens"
            )
        return full_attention_cache(StaticCache(config=config, max_cache_len=max_len), max_cache_len=max_len)
    if generation_config.cache_implementation not in (None, "dynamic"):
        raise UnsupportedError(
            f"cache_implementation={generation_config.cache_implementation!r} cannot be exported; use 'dynamic' "
            "(the default) or 'static'"
        )
    return full_attention_cache(DynamicCache(config=config))


def _own_cache_class(model: torch.nn.Module) -> type | None:
    """The model's own cache class, where its base model's forward names one in ``past_key_values``' annotation
    (MiniMax: ``MiniMaxCache | None``, a ``DynamicCache`` with linear-attention states that its forward builds and
    requires); ``None`` for transformers' generic caches."""
    import typing

    from transformers import cache_utils as cu

    base = getattr(model, "base_model", model)
    param = inspect.signature(base.forward).parameters.get("past_key_values")
    annotation = None if param is None else param.annotation
    for kind in typing.get_args(annotation) or (annotation,):
        if isinstance(kind, type) and issubclass(kind, cu.Cache) and kind.__module__ != cu.__name__:
            return kind
    return None


def _encoder_decoder_cache(config: Any, generation_config: Any) -> Any:
    """The dynamic ``EncoderDecoderCache`` ``generate`` would build for a decoder with sliding-window layers
    (T5Gemma), those layers made full; ``None`` (``generate`` builds it) for the others. A sliding layer keeps its
    length in a Python int (``cumulative_length``), which the trace bakes in: the decode graph's self-attention
    cache was pinned to the capture's length."""
    from transformers import DynamicCache, EncoderDecoderCache

    text = config.get_text_config(decoder=True)
    kinds = getattr(text, "layer_types", None) or ()
    if generation_config.cache_implementation not in (None, "dynamic") or not any("sliding" in k for k in kinds):
        return None
    return full_attention_cache(EncoderDecoderCache(DynamicCache(config=text), DynamicCache(config=text)))


def merge_decode_calls(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    """Merge two consecutive single-token decode calls into one two-token call from the first one's cache.

    Sequence inputs are concatenated along their last (query) axis, 4D masks along the query axis, a 2D mask and
    anything else that grows is taken from the second call, the cache from the first.
    """
    merged: dict[str, Any] = {}
    for key, a in first.items():
        b = second.get(key)
        if key in _SEQ_KEYS and isinstance(a, torch.Tensor):
            dim = 1 if key.endswith("input_ids") or key.endswith("inputs_embeds") else a.dim() - 1
            merged[key] = torch.cat([a, b], dim=dim)
        elif key in _MASK_KEYS:
            merged[key] = _merge_mask(a, b)
        elif is_cache(a):
            merged[key] = a
        elif isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape != b.shape:
            raise UnsupportedError(f"cannot merge decode kwarg {key!r}: shapes {tuple(a.shape)} and {tuple(b.shape)}")
        else:
            merged[key] = a
    return merged


def keep_every_position(model: torch.nn.Module, call: Mapping[str, Any]) -> dict[str, Any]:
    """A multi-token decode call with ``logits_to_keep`` as the index tensor of every query position, where the
    forward takes it (transformers' ``slice_logits_to_keep`` reads a 1-D tensor as the positions to keep).

    Traced so, the query positions the LM head projects are an input of the graph: a caller that reads only the
    last position (a prefill served by this graph: ``generate()``'s ``logits_to_keep=1``) passes that one index and
    skips the head's FLOPs for the rest of the prompt (a fifth of SmolLM2's 512-token prefill, most of Gemma 3's
    with its 262144-token vocabulary), one that verifies drafts passes them all; hfexport's runner passes every
    position when a call names none (the forward's default, 0). Opt-in (``logits_to_keep_input``): a loop that
    drives the graph on its runtime directly (the guide's ONNX Runtime and ExecuTorch C++ loops) feeds it one input
    more.
    """
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return dict(call)
    ids = next((call[k] for k in ("input_ids", "inputs_embeds") if isinstance(call.get(k), torch.Tensor)), None)
    if ids is None or ids.dim() < 2:
        return dict(call)
    return {**call, "logits_to_keep": torch.arange(ids.shape[1], device=ids.device)}


def _merge_mask(a: Any, b: Any) -> Any:
    if isinstance(a, Mapping):
        return {k: _merge_mask(a[k], b[k]) for k in a}
    if isinstance(a, torch.Tensor) and a.dim() == 4:
        return torch.cat([a, b], dim=2)
    return b


def decompose_prefill_decode(
    model: torch.nn.Module,
    inputs: Mapping[str, Any],
    generation_config: Any = None,
    multi_token_decode: bool = False,
    logits_to_keep_input: bool = False,
) -> dict[str, tuple[torch.nn.Module, dict]]:
    """Run ``model.generate()`` and capture the prefill and decode forward kwargs.

    Args:
        model: A generative model.
        inputs: Generate kwargs (``input_ids``, ``attention_mask``, modality inputs...).
        generation_config: Forwarded to ``generate`` (default: the model's). ``cache_implementation="static"`` with
            ``max_cache_len=N`` captures a fixed-size ``StaticCache`` of N positions.
        multi_token_decode: Capture two decode steps merged into one (symbolic query length).
        logits_to_keep_input: With ``multi_token_decode``, the merged decode also takes ``logits_to_keep``, the
            query positions whose logits it returns (see :func:`keep_every_position`).

    Returns:
        ``{"prefill": (model, kwargs), "decode": (model, kwargs)}``, plus ``"encoder"`` for encoder-decoder models.
        Neither ``model``, ``inputs`` nor ``generation_config`` is modified.
    """
    gen = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    # one token more than the decode needs: a decode captured against a cache of length 1 (an encoder-decoder's
    # first step) would have that length specialised by torch.export, so such a first step is skipped
    new_tokens = 4 if multi_token_decode else 3
    gen.max_new_tokens = new_tokens
    gen.min_new_tokens = new_tokens
    gen.do_sample = False
    gen.num_beams = 1
    kwargs = dict(inputs)
    ids = kwargs.get("input_ids")
    batch = ids.shape[0] if isinstance(ids, torch.Tensor) else 1
    prompt_len = ids.shape[-1] if isinstance(ids, torch.Tensor) else 0
    cache = _build_cache(model, gen, batch, prompt_len, new_tokens)
    if cache is not None:
        kwargs["past_key_values"] = cache
        gen.cache_implementation = None
        gen.max_cache_len = None
    encoder = _encoder_of(model)
    recorder = CallRecorder(model)
    inner = _delegate_of(model)
    inner_recorder = CallRecorder(inner) if inner is not None else None
    encoder_recorder = CallRecorder(encoder) if encoder is not None else None
    attrs_before = set(vars(model))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model.generate(**kwargs, generation_config=gen)
    finally:
        recorder.remove()
        if inner_recorder is not None:
            inner_recorder.remove()
        if encoder_recorder is not None:
            encoder_recorder.remove()
        for name in set(vars(model)) - attrs_before:
            delattr(model, name)
        model.train(was_training)
    # a forward generate() runs outside its loop, without the cache (Whisper's language detection, its no-speech
    # check: use_cache=False) is not a step of the loop
    calls = [c for c in recorder.calls if c.get("use_cache") is not False]
    if multi_token_decode and any(_has_recurrent_state(v) for v in calls[-1].values()):
        raise UnsupportedError(
            f"multi_token_decode is not supported for {type(model).__name__}: its forward restarts the state-space "
            "scan from a zero state when given more than one token with a cache (transformers runs the recurrent "
            "update only for one token at a time), so a merged decode would not continue the sequence. Use "
            "multi_token_decode=False."
        )
    needed = 1 + (2 if multi_token_decode else 1)
    if not recorder.calls and inner_recorder is not None and len(inner_recorder.calls) >= needed:
        # generate() ran the inner language model's generate (BLIP-2): its prefill takes the merged inputs_embeds,
        # which the outer forward computes, so the prefill is the outer forward on the prompt (with the inner
        # prefill's cache), the decode the inner model's own step
        inner_calls = [c for c in inner_recorder.calls if c.get("use_cache") is not False]
        prefill = {**inputs, "past_key_values": inner_calls[0].get("past_key_values"), "use_cache": True}
        params = inspect.signature(model.forward).parameters
        swallows = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())  # (passed on to the LM)
        prefill = {k: v for k, v in prefill.items() if (k in params or swallows) and v is not None}
        first = 1 if _cache_length(inner_calls[1]) >= 2 or len(inner_calls) <= needed else 2
        decode = merge_decode_calls(inner_calls[first], inner_calls[first + 1]) if multi_token_decode \
            else inner_calls[first]
        if multi_token_decode and logits_to_keep_input:
            decode = keep_every_position(inner, decode)
        return {"prefill": (model, prefill), "decode": (inner, decode)}
    if len(calls) < needed:
        raise UnsupportedError(
            f"capturing generate() of {type(model).__name__} saw {len(calls)} forward call(s), expected {needed} "
            "(prefill, then decode): the model's generate() does not call its own forward for each step (it may "
            "delegate to an inner model); call decompose_prefill_decode on the module that generate() runs"
        )
    if rereads_sequence(calls):
        # no cache kept: each step is one forward over the whole sequence so far, the prefill's computation, so the
        # decode component is that call too (an export serves it with the prefill's graph, generate() feeds it the
        # whole sequence); the cache and generate's bookkeeping the forward only swallowed through **kwargs go
        prefill = _without_swallowed(model, calls[0])
        return {"prefill": (model, prefill), "decode": (model, _without_swallowed(model, calls[1]))}
    first = 1 if _cache_length(calls[1]) >= 2 or len(calls) <= needed else 2
    _refuse_streaming_encoder(model, calls[first])
    decode = merge_decode_calls(calls[first], calls[first + 1]) if multi_token_decode else calls[first]
    if multi_token_decode and logits_to_keep_input:
        decode = keep_every_position(model, decode)
    out: dict[str, tuple[torch.nn.Module, dict]] = {}
    if encoder_recorder is not None and encoder_recorder.calls:
        out["encoder"] = (encoder, encoder_recorder.calls[0])
    out["prefill"] = (model, calls[0])
    out["decode"] = (model, decode)
    return out


# a decode step's inputs that feed an encoder a new chunk of its input, with a cache of the encoder's own
_STREAMED = ("encoder_inputs_embeds", "encoder_past_key_values")


def _refuse_streaming_encoder(model: torch.nn.Module, decode: Mapping[str, Any]) -> None:
    """Refuse a model whose generate() runs its encoder again at every decode step on the next chunk of its input,
    with the encoder's own cache (Voxtral Realtime: one audio embedding per text position, streamed)."""
    streamed = [k for k in decode if k in _STREAMED]
    if streamed:
        caches = [k for k, v in decode.items() if k != "past_key_values" and is_cache(v)]
        raise UnsupportedError(
            f"{type(model).__name__}'s generate() streams its encoder: each decode step takes the next chunk of its "
            f"input and the encoder's own state ({', '.join(streamed + [c for c in caches if c not in streamed])}), "
            "which export_for_generation does not split into programs yet; export() exports its forward alone"
        )


# what generate() passes every forward; a forward that names none of them takes them through **kwargs and drops them
_GENERATE_BOOKKEEPING = ("past_key_values", "use_cache", "cache_position", *GENERATE_HINTS)


def rereads_sequence(calls: list[Mapping[str, Any]]) -> bool:
    """Whether generate() fed the model its whole sequence again at the first decode step: a model that keeps no
    cache (OpenAI GPT, XLNet, ...) and recomputes every position at each step."""
    ids0, ids1 = calls[0].get("input_ids"), calls[1].get("input_ids") if len(calls) > 1 else None
    if not isinstance(ids0, torch.Tensor) or not isinstance(ids1, torch.Tensor):
        return False
    return ids1.shape[-1] > ids0.shape[-1]


def _without_swallowed(model: torch.nn.Module, call: Mapping[str, Any]) -> dict[str, Any]:
    """``call`` less generate's bookkeeping the forward takes only through ``**kwargs``, and less the ``None``s it
    passes for a parameter whose default is ``None`` (a program input of its own on ExecuTorch)."""
    params = {
        name: p for name, p in inspect.signature(model.forward).parameters.items()
        if p.kind not in (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    }
    return {
        k: v for k, v in call.items()
        if (k in params or k not in _GENERATE_BOOKKEEPING) and not (v is None and k in params and params[k].default is None)
    }


def _has_recurrent_state(value: Any) -> bool:
    layers = getattr(value, "layers", None) if is_cache(value) else None
    return bool(layers) and any(hasattr(layer, "recurrent_states") for layer in layers)


def _cache_length(call: Mapping[str, Any]) -> int:
    for value in call.values():
        if is_cache(value) and hasattr(value, "get_seq_length"):
            try:
                return int(value.get_seq_length())
            except (TypeError, ValueError, AttributeError, IndexError):
                return 2
    return 2


def _delegate_of(model: torch.nn.Module) -> torch.nn.Module | None:
    """The inner language model whose own ``generate`` a model's ``generate`` may run (BLIP-2's
    ``language_model``, a generative model of its own), else ``None``."""
    for name in ("language_model", "text_model"):  # (Kosmos-2's text model generates with the image embeddings)
        inner = getattr(model, name, None)
        can = getattr(inner, "can_generate", None)
        if isinstance(inner, torch.nn.Module) and callable(can) and can():
            return inner
    return None


def _encoder_of(model: torch.nn.Module) -> torch.nn.Module | None:
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return None
    get_encoder = getattr(model, "get_encoder", None)
    return get_encoder() if callable(get_encoder) else None
