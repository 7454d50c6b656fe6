"""One ``generate()`` call's plan, built by transformers' own generation machinery, as ``model.generate`` builds it.

``GenerationMixin`` resolves the call's generation config (the saved one, then ``generation_config=``, then the
keyword arguments; validated), its special tokens, its lengths, its logits processors and its stopping criteria from
the model's config alone. So an export runs the same code on a small host that holds the export's config and
generation config (:class:`GenerationHost`): every processor and criterion transformers has (repetition and n-gram
penalties, bad words, suppressed tokens, forced BOS/EOS, min length, temperature / top-k / top-p / min-p / typical /
epsilon / eta, stop strings, max time, user ``logits_processor=`` / ``stopping_criteria=``) applies unchanged.

What needs the model's forward beyond logits (guidance, contrastive search, DoLa, attentions, hidden states,
an assistant's early exit, constrained beams) is refused by name before the first step, never dropped (:data:`REFUSED`).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

import torch

from ..errors import UnsupportedError

__all__ = ["GenerationHost", "GenerationPlan", "plan_generation", "REFUSED", "CALL_ARGUMENTS"]

#: generation config fields this loop cannot honour -> why; refused when set to anything but the default
REFUSED: dict[str, str] = {
    "guidance_scale": "classifier-free guidance runs the model a second time per step on an unconditional prompt",
    "penalty_alpha": "contrastive search needs the model's hidden states at every step",
    "dola_layers": "DoLa decoding reads early-exit logits from intermediate layers",
    "num_beam_groups": "group (diverse) beam search was removed from transformers' core generate",
    "diversity_penalty": "group (diverse) beam search was removed from transformers' core generate",
    "constraints": "constrained beam search is not implemented over exported graphs",
    "force_words_ids": "constrained beam search is not implemented over exported graphs",
    "output_attentions": "the exported graphs return logits and the cache, not attentions",
    "output_hidden_states": "the exported graphs return logits and the cache, not hidden states",
    "assistant_early_exit": "early-exit drafting runs the model's own first layers, which no exported graph returns",
    "token_healing": "token healing re-tokenizes the prompt with the model's own generate",
    "watermarking_config": "watermarking is not implemented over exported graphs",
    "use_mtp": "multi-token prediction heads are not exported",
    "prefill_chunk_size": "the export's prefill graph takes the whole prompt in one call",
}

#: arguments of ``model.generate`` that are not generation config fields, and that ``generate()`` takes too
CALL_ARGUMENTS = ("generation_config", "streamer", "logits_processor", "stopping_criteria", "tokenizer",
                  "prefix_allowed_tokens_fn", "assistant_model")

# call arguments of model.generate refused here (they need a model, or a loop this one is not)
_REFUSED_CALLS = {
    "negative_prompt_ids": "classifier-free guidance is not supported",
    "negative_prompt_attention_mask": "classifier-free guidance is not supported",
    "synced_gpus": "exported graphs run in one process",
    "custom_generate": "a Hub generation recipe runs code from the Hub",
    "use_model_defaults": "the export's saved generation config is its defaults",
}


@functools.cache
def host_class() -> type:
    from transformers.generation.utils import GenerationMixin

    class GenerationHost(GenerationMixin):
        """What ``GenerationMixin``'s config, length, processor and criteria builders read of a model: its config
        and its generation config; nothing here runs a forward."""

        def __init__(self, config: Any, generation_config: Any):
            self.config = config
            self.generation_config = generation_config

    return GenerationHost


def GenerationHost(config: Any, generation_config: Any) -> Any:  # noqa: N802 - a class built on first use
    """A host for ``GenerationMixin``'s builders (transformers is imported on first use, not with this module)."""
    return host_class()(config, generation_config)


@dataclasses.dataclass
class GenerationPlan:
    """The resolved generation config and what builds the call's processors and criteria."""

    gen: Any
    host: Any
    streamer: Any = None
    logits_processor: Any = None
    stopping_criteria: Any = None
    tokenizer: Any = None
    prefix_allowed_tokens_fn: Any = None
    assistant_model: Any = None
    encoder_input_ids: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None

    def processors(self, input_len: int, device: torch.device) -> Any:
        """``GenerationMixin._get_logits_processor``: the call's logits processors (and warpers, when sampling)."""
        from transformers import LogitsProcessorList

        # a decoder's mask lets a repetition penalty skip each row's padding (an encoder-decoder's decoder has none)
        mask = {} if self.attention_mask is None or self.host.config.is_encoder_decoder else \
            {"attention_mask": self.attention_mask}
        return self.host._get_logits_processor(
            generation_config=self.gen, input_ids_seq_length=input_len, encoder_input_ids=self.encoder_input_ids,
            prefix_allowed_tokens_fn=self.prefix_allowed_tokens_fn,
            logits_processor=self.logits_processor if self.logits_processor is not None else LogitsProcessorList(),
            device=device, model_kwargs=mask,
        )

    def criteria(self) -> Any:
        """``GenerationMixin._get_stopping_criteria``: max length, EOS, stop strings, max time, the user's."""
        from transformers import StoppingCriteriaList

        return self.host._get_stopping_criteria(
            generation_config=self.gen,
            stopping_criteria=self.stopping_criteria if self.stopping_criteria is not None else StoppingCriteriaList(),
            tokenizer=self.tokenizer,
        )


def default_config(exported: Any) -> Any:
    from transformers import PretrainedConfig

    config = exported.config
    if config is None:
        config = PretrainedConfig(is_encoder_decoder="encoder" in exported.components)
    return config


# values of a refused field that ask for nothing (every other value is refused)
_INACTIVE: dict[str, tuple[Any, ...]] = {
    "guidance_scale": (1, 1.0), "penalty_alpha": (0, 0.0), "num_beam_groups": (1,), "diversity_penalty": (0, 0.0),
    "constraints": ([],), "force_words_ids": ([],), "output_attentions": (False,), "output_hidden_states": (False,),
    "token_healing": (False,), "use_mtp": (False,),
}


def _refuse_unsupported(gen: Any) -> None:
    asked = [(k, why) for k, why in REFUSED.items()
             if getattr(gen, k, None) is not None and getattr(gen, k) not in _INACTIVE.get(k, ())]
    if asked:
        raise UnsupportedError("ExportedModel.generate cannot honour " + "; ".join(
            f"{k}={getattr(gen, k)!r} ({why})" for k, why in asked) + ": drop it, or generate with the eager model")


def _refuse_unknown_inputs(exported: Any, inputs: dict[str, Any]) -> None:
    """A model input no component was exported with is refused, as ``model.generate`` refuses a kwarg its
    model's forward does not take (``ValueError``)."""
    from ..capture.multimodal import ENCODER_INPUT_ALIASES, MODALITY_INPUTS

    # the loops read these beside the components' own kwargs: a processor's names for what an encoder was traced
    # with under its own (hidden_states <- pixel_values), the grids, videos, audio masks (each refused by name
    # where the export's model type has no glue for it)
    known = {"input_ids", "attention_mask"}
    if any(name.endswith("_encoder") or name.endswith("_features") for name in exported.components):  # an encoder
        known.update(MODALITY_INPUTS)
    for component in exported.components.values():
        known.update(component.metadata.kwargs)
        known.update(ENCODER_INPUT_ALIASES.get(k, k) for k in component.metadata.kwargs)
    unknown = sorted(k for k in inputs if k not in known)
    if unknown:
        raise UnsupportedError(
            f"The following model_kwargs are not used by the exported model: {unknown} (its components take "
            f"{sorted(known)}); drop them, or check them for typos"
        )


def plan_generation(exported: Any, kwargs: dict[str, Any], device: torch.device, host: Any = None) -> GenerationPlan:
    """Pop the generation arguments off ``kwargs`` (what remains are the model inputs) and resolve them the way
    ``model.generate`` does: ``generation_config=`` or the export's saved one, overridden by the keyword arguments,
    validated; lengths from the prompt (an encoder-decoder's: its ``decoder_input_ids``, else the start token);
    special tokens as tensors on ``device``. ``host``: the model class's own generation host (Whisper's), else a
    :class:`GenerationHost` over the export's configs."""
    for key in [k for k in kwargs if k in _REFUSED_CALLS and (kwargs[k] is None or kwargs[k] is False)]:
        del kwargs[key]  # asks for nothing (Whisper's generate passes synced_gpus=False on)
    refused = [k for k in kwargs if k in _REFUSED_CALLS]
    if refused:
        raise UnsupportedError("ExportedModel.generate cannot honour " + "; ".join(
            f"{k}= ({_REFUSED_CALLS[k]})" for k in refused))
    calls = {k: kwargs.pop(k) for k in CALL_ARGUMENTS if k in kwargs}
    if host is None:
        saved = exported.generation_config
        host = GenerationHost(default_config(exported), copy.deepcopy(saved) if saved is not None else None)
    if host.generation_config is None:
        from transformers import GenerationConfig

        host.generation_config = GenerationConfig()
    explicit = calls.get("generation_config")
    has_default_max = kwargs.get("max_length") is None and (explicit is None or explicit.max_length is None) \
        and host.generation_config.max_length is None
    has_default_min = kwargs.get("min_length") is None and (explicit is None or explicit.min_length is None) \
        and host.generation_config.min_length is None
    generation_keys = set(_config_fields())
    inputs = {k: kwargs.pop(k) for k in list(kwargs) if k not in generation_keys}
    gen, leftover = host._prepare_generation_config(explicit, **kwargs)
    kwargs.clear()
    kwargs.update(inputs, **leftover)
    _refuse_unsupported(gen)
    _refuse_unknown_inputs(exported, kwargs)
    host._prepare_special_tokens(gen, "attention_mask" in kwargs, device=device)
    if "encoder" in exported.components:
        decoder_ids = kwargs.get("decoder_input_ids")
        input_len = 1 if decoder_ids is None else int(decoder_ids.shape[-1])
        encoder_ids = kwargs.get("input_ids")
    else:
        ids = kwargs.get("input_ids")
        if ids is None:
            raise UnsupportedError(f"generate() needs input_ids (got {sorted(kwargs)})")
        input_len, encoder_ids = int(ids.shape[-1]), None
    host._prepare_generated_length(gen, has_default_max, has_default_min, "input_ids", input_len, None)
    gen.max_new_tokens = max(int(gen.max_length) - input_len, 0)
    if gen.max_new_tokens < 1:
        raise UnsupportedError(f"max_length ({gen.max_length}) leaves no room after the {input_len}-token prompt; "
                               "pass max_new_tokens")
    return GenerationPlan(gen=gen, host=host, streamer=calls.get("streamer"),
                          logits_processor=calls.get("logits_processor"),
                          stopping_criteria=calls.get("stopping_criteria"), tokenizer=calls.get("tokenizer"),
                          prefix_allowed_tokens_fn=calls.get("prefix_allowed_tokens_fn"),
                          assistant_model=calls.get("assistant_model"),
                          encoder_input_ids=encoder_ids, attention_mask=kwargs.get("attention_mask"))


@functools.cache
def _config_fields() -> tuple[str, ...]:
    """The generation config's fields (what ``model.generate`` reads as generation arguments)."""
    from transformers import GenerationConfig

    return tuple(k for k in GenerationConfig().to_dict() if not k.startswith("_") and k != "transformers_version")


def honoured_arguments() -> tuple[str, ...]:
    """Every generation argument ``generate()`` honours: the config fields not in :data:`REFUSED`, and the call
    arguments."""
    return tuple(k for k in _config_fields() if k not in REFUSED) + CALL_ARGUMENTS
