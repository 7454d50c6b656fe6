"""``generate()``: the generation config of the call, then the loop for the export's kind."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedError
from ..registry import runner_class_for
from ..runner import torch_single_thread
from .assisted import generate_assisted
from .beam import generate_beam
from .decoder import generate_decoder
from .encoder_decoder import generate_encoder_decoder
from .multimodal import generate_multimodal
from .plan import honoured_arguments, plan_generation
from .whisper import generate_whisper, uses_whisper_generate

__all__ = ["generate", "GENERATION_ARGUMENTS"]

#: the generation arguments generate() honours: every generation config field but the refused ones (each refused
#: by name, never dropped), and the call arguments of model.generate (streamer, logits_processor, ...)
GENERATION_ARGUMENTS = honoured_arguments()


def generate(exported: Any, **kwargs: Any) -> Any:
    """Generate token ids with the exported components; returns what ``model.generate`` returns.

    Args:
        exported: An :class:`~hfexport.ExportedModel` from ``export_for_generation``.
        kwargs: The processor's output (``input_ids``, ``attention_mask``, ...) and what ``model.generate``
            takes (:data:`GENERATION_ARGUMENTS`: generation config fields, ``generation_config``, ``streamer``,
            ``logits_processor``, ``stopping_criteria``, ``tokenizer``, ``prefix_allowed_tokens_fn``).
    """
    if runner_class_for(exported.export_format).computes_with_torch:
        return _generate(exported, kwargs)
    with torch_single_thread():  # the loop's own torch ops are small; the cores are the runtime's
        return _generate(exported, kwargs)


def _generate(exported: Any, kwargs: dict[str, Any]) -> Any:
    device = _loop_device(exported)
    kwargs = {k: v.to(device) if isinstance(v, torch.Tensor) and v.device != device else v for k, v in kwargs.items()}
    if uses_whisper_generate(exported):  # the model class's own generate (prompt, processors, segments)
        return generate_whisper(exported, kwargs, device)
    plan = plan_generation(exported, kwargs, device)
    if getattr(plan.gen, "num_beams", 1) not in (None, 1):
        # refuses, naming the backend, where the cache cannot be reordered
        beam = generate_encoder_decoder if "encoder" in exported.components else generate_beam
        return beam(exported, plan, kwargs)
    if getattr(plan.gen, "prompt_lookup_num_tokens", None) or plan.assistant_model is not None:
        return generate_assisted(exported, plan, kwargs)
    if "encoder" in exported.components:
        return generate_encoder_decoder(exported, plan, kwargs)
    if "language_model" in exported.components:
        return generate_multimodal(exported, plan, kwargs)
    if "prefill" not in exported.components or "decode" not in exported.components:
        raise UnsupportedError(
            f"generate() needs the components of export_for_generation; this export has {list(exported.components)}"
        )
    return generate_decoder(exported, plan, kwargs)


def _loop_device(exported: Any) -> torch.device:
    """Where the loop keeps its tensors: where the export's runners return theirs (the first component's), like
    ``model.generate`` on ``model.device``; the caller's inputs are moved there."""
    return exported.runner(next(iter(exported.components))).output_device
