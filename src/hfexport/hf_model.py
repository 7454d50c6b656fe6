"""What a transformers model's forward says about its own arguments, as far as every layer needs to know.

Labels are training inputs (a loss is not exported) and the output flags choose what a forward returns: neither is a
traced input of an export.
"""

from __future__ import annotations

from typing import Any

__all__ = ["LABEL_KEYS", "OUTPUT_FLAGS", "VALUE_INPUTS", "label_keys"]

LABEL_KEYS = frozenset({"labels", "future_values", "next_sentence_label", "start_positions", "end_positions"})
#: Labels that an encoder-decoder forecaster's decoder reads as its input (Time Series Transformer, Informer and
#: Autoformer teacher-force their decoder with the future values; PatchTST only computes a loss from them).
DECODER_INPUT_LABELS = frozenset({"future_values"})
OUTPUT_FLAGS = ("use_cache", "return_dict", "output_attentions", "output_hidden_states", "output_router_logits")
#: Integer tensor inputs whose values the models read as Python ints to size their tensors (each image's height and
#: width: Pixtral's patch grid, Mistral 3's patch merger, LLaVA-NeXT's tiles): traced as constant lists, so the export
#: is specialised on them, and a call with other values is refused by name.
VALUE_INPUTS = frozenset({"image_sizes"})


def label_keys(config: Any) -> frozenset[str]:
    """The keys of :data:`LABEL_KEYS` that are labels for a model of ``config``: all of them, less
    :data:`DECODER_INPUT_LABELS` for an encoder-decoder model, whose decoder reads them (not traced, the export would
    decode from nothing: Time Series Transformer's ``last_hidden_state`` had 1 position instead of 4)."""
    if getattr(config, "is_encoder_decoder", False) is True:
        return LABEL_KEYS - DECODER_INPUT_LABELS
    return LABEL_KEYS
