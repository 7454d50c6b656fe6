"""RWKV: the single-token step's time shift kept per row, so a batch of more than one row decodes each row alone.

``RwkvSelfAttention.extract_key_value`` and ``RwkvFeedForward.forward`` (transformers' modeling_rwkv.py) take a step
of one token with a state from ``state[i][:, :, layer_id]``, ``[batch, hidden]``, and mix it with the token's
``[batch, 1, hidden]`` hidden states: broadcasting makes that ``[batch, batch, hidden]``, every row mixed with every
other row's state (eager's decode logits of a batch of 2 are ``[2, 2, vocab]``, and ``generate`` reads row 1's
mixing for both). A batch of one is unaffected. The trace also pins the batch to the sample's ("Guard failed:
input_ids.size()[0] == 2"). While tracing, the step's shifted states are ``[batch, 1, hidden]``, the value the
multi-token branch gives for one token: each row decodes as it does alone. Drop it once upstream unsqueezes the state.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..registry import patch_attribute, undo_all, uses_class, workaround

_RWKV = "transformers.models.rwkv.modeling_rwkv"


def _shifted(module: Any, hidden: torch.Tensor, past: torch.Tensor | None) -> torch.Tensor:
    """The previous token's hidden states at each position, ``[batch, seq, hidden]``; the state's at the first."""
    shifted = module.time_shift(hidden)
    if past is not None:
        shifted[:, 0] = past[:, :, module.layer_id]
    return shifted


def _extract_key_value(self: Any, hidden: torch.Tensor, state: Any = None) -> tuple[Any, ...]:
    shifted = _shifted(self, hidden, None if state is None else state[1])
    key = self.key(hidden * self.time_mix_key + shifted * (1 - self.time_mix_key))
    value = self.value(hidden * self.time_mix_value + shifted * (1 - self.time_mix_value))
    receptance = torch.sigmoid(self.receptance(hidden * self.time_mix_receptance
                                               + shifted * (1 - self.time_mix_receptance)))
    if state is not None:
        state[1][:, :, self.layer_id] = hidden[:, -1]
    return receptance, key, value, state


def _feed_forward(self: Any, hidden: torch.Tensor, state: Any = None) -> tuple[torch.Tensor, Any]:
    shifted = _shifted(self, hidden, None if state is None else state[0])
    key = torch.square(torch.relu(self.key(hidden * self.time_mix_key + shifted * (1 - self.time_mix_key))))
    receptance = torch.sigmoid(self.receptance(hidden * self.time_mix_receptance
                                               + shifted * (1 - self.time_mix_receptance)))
    if state is not None:
        state[0][:, :, self.layer_id] = hidden[:, -1]
    return receptance * self.value(key), state


@workaround(
    id="rwkv-batched-step-shift",
    backend="all",
    target=f"{_RWKV}.RwkvSelfAttention.extract_key_value, {_RWKV}.RwkvFeedForward.forward",
    breaks="a one-token step with a state mixes [batch, 1, hidden] with [batch, hidden]: [batch, batch, hidden], each "
    "row mixed with every row's state, and the decode graph pinned to the sample's batch",
    upstream="transformers models/rwkv/modeling_rwkv.py RwkvSelfAttention.extract_key_value and "
    "RwkvFeedForward.forward (state[i][:, :, self.layer_id] not unsqueezed); no issue known",
    versions={"transformers": ">=5.0,<5.24"},
    applies=lambda model, inputs: uses_class(model, _RWKV, "RwkvModel"),
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    module = sys.modules[_RWKV]
    return undo_all([patch_attribute(module.RwkvSelfAttention, "extract_key_value", _extract_key_value),
                     patch_attribute(module.RwkvFeedForward, "forward", _feed_forward)])
