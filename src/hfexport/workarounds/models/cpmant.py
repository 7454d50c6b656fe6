"""CPM-Ant: its attention mask built without a Python list of the sequence length, so the length stays dynamic.

``CpmAntModel._prepare_attention_mask`` (transformers' modeling_cpmant.py) makes its left-padding mask from
``torch.tensor(list(range(seqlen - self.prompt_length))[::-1])``: a Python list as long as the (symbolic) sequence,
which specializes it to the traced length ("You marked seq as dynamic but your code specialized it to be a constant
(6)"), so an export takes that one prompt length and, since CPM-Ant's decode step reads the whole sequence again,
never a second step. While tracing, the same mask is built with ``torch.arange(seqlen - prompt_length - 1, -1, -1)``
(the same values, int64 as ``torch.tensor`` of a list of ints gives). Drop it once the list is gone upstream.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..registry import patch_attribute, uses_class, workaround

_CPMANT = "transformers.models.cpmant.modeling_cpmant"


def _prepare_attention_mask(self: Any, input_ids: torch.Tensor, span: torch.Tensor, context: torch.Tensor,
                            length: torch.Tensor) -> torch.Tensor:
    """``CpmAntModel._prepare_attention_mask`` with the reversed positions from ``torch.arange``."""
    batch, seqlen = input_ids.size(0), input_ids.size(1)
    device = input_ids.device
    positions = torch.arange(seqlen, device=device)
    directional_mask_2d = positions <= positions.view(-1, 1)
    attention_mask = context[:, None, :] | (
        context[:, :, None].logical_not() & directional_mask_2d.view(1, seqlen, seqlen)
    )
    attention_mask = attention_mask & (span[:, None, :] == span[:, :, None])
    reversed_positions = torch.arange(seqlen - self.prompt_length - 1, -1, -1, device=device)
    mask_1d = reversed_positions[None, :].repeat(batch, 1) < length[:, None]
    mask_1d = torch.cat((torch.ones(batch, self.prompt_length, device=device).bool(), mask_1d), dim=1)
    return mask_1d.view(batch, seqlen, 1) & mask_1d.view(batch, 1, seqlen) & attention_mask


@workaround(
    id="cpmant-dynamic-mask-length",
    backend="all",
    target=f"{_CPMANT}.CpmAntModel._prepare_attention_mask",
    breaks="torch.tensor(list(range(seqlen - prompt_length))[::-1]) specializes the sequence length to the traced "
    "one: the export takes one prompt length and no decode step",
    upstream="transformers models/cpmant/modeling_cpmant.py CpmAntModel._prepare_attention_mask; no issue known",
    versions={"transformers": ">=5.0,<5.24"},
    applies=lambda model, inputs: uses_class(model, _CPMANT, "CpmAntModel"),
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    return patch_attribute(sys.modules[_CPMANT].CpmAntModel, "_prepare_attention_mask", _prepare_attention_mask)
