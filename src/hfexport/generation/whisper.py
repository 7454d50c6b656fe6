"""Whisper's own ``generate`` over the exported graphs.

``WhisperForConditionalGeneration.generate`` is not ``GenerationMixin.generate``: transformers'
``WhisperGenerationMixin`` builds the decoder prompt (start of transcript, language, task, no-timestamps: from
``language=`` / ``task=`` or the saved ``forced_decoder_ids``, detecting the language when neither says it), the
suppress / begin-suppress / timestamp processors with the prompt's length as their begin index, cuts long audio into
30-second segments, falls back through temperatures, and strips the prompt and the EOS from what it returns. All of
that runs here unchanged, on a host whose ``GenerationMixin.generate`` (the ``super().generate`` that Whisper calls
once per segment) is the export's encoder-decoder loop, and whose forward (language detection, the no-speech check)
is one call of the exported encoder and prefill graphs.
"""

from __future__ import annotations

import copy
import functools
import types
from typing import Any

import torch

from ..errors import UnsupportedError
from .encoder_decoder import forward_once, generate_encoder_decoder
from .plan import default_config, host_class, plan_generation

__all__ = ["generate_whisper", "uses_whisper_generate"]

# WhisperEncoder's two convolutions: conv1 keeps the frame rate, conv2 halves it (fixed in modeling_whisper.py, not
# in the config); Whisper's generate reads their strides for the segment length in frames
_CONV_STRIDES = (1, 2)

_CLEARED = ("suppress_tokens", "begin_suppress_tokens")

# Whisper generate arguments that need what the exported graphs do not return
_REFUSED = {
    "return_token_timestamps": "token timestamps need the decoder's cross-attentions, which the exported graphs do "
    "not return",
}


def uses_whisper_generate(exported: Any) -> bool:
    """Whether the export's model class generates with ``WhisperGenerationMixin.generate``."""
    config = exported.config
    return config is not None and getattr(config, "model_type", None) == "whisper" and \
        "encoder" in exported.components


@functools.cache
def _whisper_host_class() -> type:
    from transformers.models.whisper.generation_whisper import WhisperGenerationMixin

    class ExportedSegments(host_class()):
        """``GenerationMixin.generate`` and the model's forward, served by the exported graphs."""

        def __init__(self, exported: Any, generation_config: Any, device: torch.device):
            super().__init__(default_config(exported), generation_config)
            self.exported = exported
            self._device = device
            conv = [types.SimpleNamespace(stride=(s,)) for s in _CONV_STRIDES]
            self.model = types.SimpleNamespace(encoder=types.SimpleNamespace(conv1=conv[0], conv2=conv[1]))

        @property
        def device(self) -> torch.device:
            return self._device

        def generate(self, inputs: Any = None, generation_config: Any = None, logits_processor: Any = None,
                     stopping_criteria: Any = None, prefix_allowed_tokens_fn: Any = None, synced_gpus: Any = None,
                     **kwargs: Any) -> Any:
            """One segment: what ``WhisperGenerationMixin.generate_with_fallback`` asks ``super().generate`` for."""
            call = dict(kwargs, input_features=inputs, generation_config=generation_config,
                        logits_processor=logits_processor, stopping_criteria=stopping_criteria,
                        prefix_allowed_tokens_fn=prefix_allowed_tokens_fn, synced_gpus=synced_gpus)
            # None is "not given", except for the suppress lists Whisper cleared after turning them into processors
            # of its own (kept None, so the saved config does not add them a second time)
            call = {k: v for k, v in call.items() if v is not None or k in _CLEARED}
            plan = plan_generation(self.exported, call, self._device, host=self)
            return generate_encoder_decoder(self.exported, plan, call)  # greedy, sampled or beams

        def __call__(self, decoder_input_ids: torch.Tensor = None, **inputs: Any) -> Any:
            """The model's forward without a kept cache: Whisper's language detection and no-speech check."""
            return forward_once(self.exported, inputs, decoder_input_ids)

    class WhisperHost(WhisperGenerationMixin, ExportedSegments):
        """Whisper's generate (first in the MRO), over :class:`ExportedSegments`."""

    return WhisperHost


def generate_whisper(exported: Any, kwargs: dict[str, Any], device: torch.device) -> Any:
    """``WhisperGenerationMixin.generate(**kwargs)`` over the export: what ``model.generate`` of a Whisper model
    returns for the same arguments."""
    refused = [k for k in _REFUSED if kwargs.get(k)]
    if refused:
        raise UnsupportedError("ExportedModel.generate cannot honour " + "; ".join(
            f"{k}= ({_REFUSED[k]})" for k in refused) + ": drop it, or generate with the eager model")
    saved = exported.generation_config
    if saved is None:
        from transformers import GenerationConfig

        saved = GenerationConfig()
    host = _whisper_host_class()(exported, copy.deepcopy(saved), device)
    return host.generate(**kwargs)
