"""``decompose_for_generation``: the graphs generation needs, the prefill split further for multimodal models.

Above both :mod:`.decompose` (prefill / decode from a watched ``generate()``) and :mod:`.multimodal` (encoders,
projector, language model), which it composes.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import UnsupportedError
from .decompose import decompose_prefill_decode
from .kwargs import CapturedKwargs
from .multimodal import decompose_multimodal, is_multimodal, with_modality_inputs

__all__ = ["decompose_for_generation", "last_logits_only"]


def decompose_for_generation(
    model: torch.nn.Module,
    inputs: Mapping[str, Any],
    generation_config: Any = None,
    multi_token_decode: bool = False,
    logits_to_keep_input: bool = False,
) -> dict[str, tuple[torch.nn.Module, dict]]:
    """Decompose a generative model into independently exportable ``(module, forward_kwargs)`` pairs.

    Keys: ``prefill``/``decode`` (and ``encoder`` for encoder-decoder models); for multimodal models, the
    prefill is further split by :func:`hfexport.utils.decompose_multimodal`. Each component's kwargs are a
    :class:`~hfexport.capture.kwargs.CapturedKwargs`: the cache is the captured one at every read, so a component
    can be run eagerly on them and then exported with them.

    Example:
        >>> components = decompose_for_generation(model, tokenizer(["Hi"], return_tensors="pt"))
        >>> sorted(components)
        ['decode', 'prefill']
    """
    components = decompose_prefill_decode(model, inputs, generation_config, multi_token_decode, logits_to_keep_input)
    prefill_model, prefill_inputs = components["prefill"]
    if not is_multimodal(model) and "mm_encoder_outputs" in prefill_inputs:
        # a model whose encoders this package does not split out (Fuyu, Gemma4 unified): generate() ran them before
        # the first forward; the prefill graph runs them itself on the modality inputs, as a caller passes them
        components["prefill"] = (prefill_model, with_modality_inputs(prefill_model, prefill_inputs, inputs))
    if is_multimodal(model):
        prefill_model, prefill_inputs = components.pop("prefill")
        decode = components.pop("decode")
        # generate() ran the encoders before the first forward and passed mm_encoder_outputs: give the modality
        # inputs back so that the captured forward runs (and shows) the encoders
        modal = with_modality_inputs(prefill_model, prefill_inputs, inputs)
        try:
            parts = decompose_multimodal(prefill_model, modal)
        except UnsupportedError:
            if _places_by_id(model):
                raise
            # a model that places its image by a mask, not placeholder ids (Kosmos-2's image_embeds_position_mask):
            # no token merge to split out, the prefill graph runs the vision tower on the modality inputs itself
            parts = {"prefill": (prefill_model, modal)}
        components.update(parts)
        components["decode"] = decode
    return {name: (module, CapturedKwargs(kwargs)) for name, (module, kwargs) in components.items()}


def _places_by_id(model: torch.nn.Module) -> bool:
    """Whether the model's config names the placeholder id its image (or other modality) features replace."""
    config = getattr(model, "config", None)
    return any(getattr(config, f"{m}_token_{suffix}", None) is not None
               for m in ("image", "video", "audio") for suffix in ("id", "index"))


def last_logits_only(model: torch.nn.Module, inputs: Mapping[str, Any]) -> Mapping[str, Any]:
    """A prefill graph's kwargs with ``logits_to_keep=1`` (traced as a constant) where its forward takes it.

    ``generate()`` reads only the prompt's last logits, and eager passes ``logits_to_keep=1`` for it: a prefill
    graph that projects every position through the LM head spends that head's FLOPs per prompt token and plans
    ``[batch, prompt, vocab]`` floats (Gemma-3: 262144 per position, 17.4 GB planned on ExecuTorch at the default
    bounds). Decode graphs keep every query position: a multi-token decode's caller (assisted decoding) reads them.
    """
    if "logits_to_keep" in inputs or "logits_to_keep" not in inspect.signature(model.forward).parameters:
        return inputs
    kept = CapturedKwargs({key: inputs[key] for key in inputs})
    kept["logits_to_keep"] = 1
    return kept
