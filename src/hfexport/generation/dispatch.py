"""``generate()``: the generation config of the call, then the loop for the export's kind."""

from __future__ import annotations

import copy
from typing import Any

import torch

from ..errors import UnsupportedError
from ..registry import runner_class_for
from ..runner import torch_single_thread
from .beam import generate_beam
from .decoder import generate_decoder
from .encoder_decoder import generate_encoder_decoder
from .multimodal import generate_multimodal

__all__ = ["generate", "GENERATION_ARGUMENTS"]

#: the generation arguments generate() honours (any other is refused, never dropped)
GENERATION_ARGUMENTS = (
    "max_new_tokens", "eos_token_id", "pad_token_id", "do_sample", "temperature", "top_k", "top_p",
    "decoder_start_token_id", "min_new_tokens", "num_beams", "num_return_sequences", "length_penalty", "early_stopping",
)


def _generation_config(exported: Any, kwargs: dict) -> Any:
    from transformers import GenerationConfig

    base = exported.generation_config
    gen = copy.deepcopy(base) if base is not None else GenerationConfig()
    overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in GENERATION_ARGUMENTS}
    explicit = kwargs.pop("generation_config", None)
    if explicit is not None:
        gen = copy.deepcopy(explicit)
    for key, value in overrides.items():
        setattr(gen, key, value)
    if gen.max_new_tokens is None:
        gen.max_new_tokens = 20
    return gen


def generate(exported: Any, **kwargs: Any) -> torch.Tensor:
    """Generate token ids with the exported components; returns what ``model.generate`` returns.

    Args:
        exported: An :class:`~hfexport.ExportedModel` from ``export_for_generation``.
        kwargs: The processor's output (``input_ids``, ``attention_mask``, ...) and generation arguments
            (``max_new_tokens``, ``eos_token_id``, ``pad_token_id``, ``do_sample``, ``temperature``, ``top_k``,
            ``top_p``, ``streamer``, ``generation_config``).
    """
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
        # refuses, naming the backend, where the cache cannot be reordered
        return generate_beam(exported, gen, streamer, kwargs)
    if "encoder" in exported.components:
        return generate_encoder_decoder(exported, gen, streamer, kwargs)
    if "language_model" in exported.components:
        return generate_multimodal(exported, gen, streamer, kwargs)
    if "prefill" not in exported.components or "decode" not in exported.components:
        raise UnsupportedError(
            f"generate() needs the components of export_for_generation; this export has {list(exported.components)}"
        )
    return generate_decoder(exported, gen, streamer, kwargs)


def _loop_device(exported: Any) -> torch.device:
    """Where the loop keeps its tensors: where the export's runners return theirs (the first component's), like
    ``model.generate`` on ``model.device``; the caller's inputs are moved there."""
    return exported.runner(next(iter(exported.components))).output_device
