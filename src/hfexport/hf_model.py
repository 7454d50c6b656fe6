"""What a transformers model's forward says about its own arguments, as far as every layer needs to know.

Labels are training inputs (a loss is not exported) and the output flags choose what a forward returns: neither is a
traced input of an export.
"""

from __future__ import annotations

__all__ = ["LABEL_KEYS", "OUTPUT_FLAGS", "VALUE_INPUTS"]

LABEL_KEYS = frozenset({"labels", "future_values", "next_sentence_label", "start_positions", "end_positions"})
OUTPUT_FLAGS = ("use_cache", "return_dict", "output_attentions", "output_hidden_states", "output_router_logits")
#: Integer tensor inputs whose values the models read as Python ints to size their tensors (each image's height and
#: width: Pixtral's patch grid, Mistral 3's patch merger, LLaVA-NeXT's tiles): traced as constant lists, so the export
#: is specialised on them, and a call with other values is refused by name.
VALUE_INPUTS = frozenset({"image_sizes"})
