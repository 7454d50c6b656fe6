"""ProphetNet: a decode step's position id kept a tensor of the cache length, so the length stays dynamic.

``ProphetNetPositionalEmbeddings.forward`` (transformers' modeling_prophetnet.py) gives a decode step the position
``int(padding_idx + input length + cache length)``: the Python ``int`` of the symbolic cache length specializes it
to the traced one ("Guard failed: 1 + past_key_values[...].size()[2] == 3"), so the exported decode graph takes one
step only and ``generate`` stops at the second new token. While tracing, the same position is filled into a
``[1, 1]`` int64 tensor from the symbolic length (``torch.full``, no ``int``). Drop it once the cast is gone
upstream.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..registry import patch_attribute, uses_class, workaround

_PROPHETNET = "transformers.models.prophetnet.modeling_prophetnet"


def _position_embeddings(self: Any, inputs_shape: Any, device: Any, attention_mask: Any = None,
                         past_key_values: Any = None, position_ids: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``ProphetNetPositionalEmbeddings.forward`` with a decode step's position as a tensor of the symbolic length
    (the prompt's positions as upstream: the mask's running count past the padding id, clamped to the table)."""
    if position_ids is None:
        if past_key_values is not None and past_key_values.get_seq_length() != 0:
            position = self.padding_idx + inputs_shape[1] + past_key_values.get_seq_length()
            position_ids = torch.full((1, 1), position, dtype=torch.long, device=device)
        else:
            if attention_mask is None:
                attention_mask = torch.ones(inputs_shape, dtype=torch.long, device=device)
            position_ids = (torch.cumsum(attention_mask, dim=1).type_as(attention_mask) * attention_mask).long()
            position_ids = (position_ids + self.padding_idx).clamp(0, self.max_length - 1)
    return torch.nn.Embedding.forward(self, position_ids), position_ids


@workaround(
    id="prophetnet-dynamic-decode-position",
    backend="all",
    target=f"{_PROPHETNET}.ProphetNetPositionalEmbeddings.forward",
    breaks="int(padding_idx + num_input_ids) specializes the cache length to the traced one: the decode graph takes "
    "one step (Guard failed: 1 + past_key_values[...].size()[2] == 3)",
    upstream="transformers models/prophetnet/modeling_prophetnet.py ProphetNetPositionalEmbeddings.forward; no issue "
    "known",
    versions={"transformers": ">=5.0,<5.24"},
    applies=lambda model, inputs: uses_class(model, _PROPHETNET, "ProphetNetPositionalEmbeddings"),
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    return patch_attribute(sys.modules[_PROPHETNET].ProphetNetPositionalEmbeddings, "forward", _position_embeddings)
