"""DBRX: trace its experts without a loop over the experts hit.

``DbrxExperts.forward`` (transformers' modeling_dbrx.py) loops ``for expert_idx in expert_hit`` over ``nonzero()`` of
the routing mask: torch.export cannot guard on the data-dependent count ("Could not guard on data-dependent
expression Eq(u0, 0)"), so DBRX exported on no backend. The class is DBRX's own (its weights stacked in
``DbrxExpertGLU``'s ``w1`` / ``v1`` / ``w2``), not transformers' experts interface, so ``set_experts_implementation``
cannot switch it. While tracing, each token's ``top_k`` experts are computed at once instead: their weights gathered
per (token, choice) and applied with batched matmuls (what transformers' ``batched_mm`` experts do), then weighted
and summed. Same result up to the order of the additions. Drop it once DBRX's experts use transformers' experts
interface.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..registry import patch_attribute, uses_class, workaround

_DBRX = "transformers.models.dbrx.modeling_dbrx"


def _batched_experts(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor) -> torch.Tensor:
    """``DbrxExperts.forward`` without data-dependent control flow: every (token, choice) pair at once."""
    batch_size = hidden_states.shape[0]
    states = hidden_states.reshape(-1, self.hidden_size)
    tokens, k = top_k_index.shape
    shape = (self.num_experts, self.ffn_hidden_size, self.hidden_size)
    index = top_k_index.reshape(-1)
    w1, v1, w2 = (weight.view(shape)[index] for weight in (self.mlp.w1, self.mlp.v1, self.mlp.w2))  # [T*k, F, H]
    # (each token repeated k times as a column: an expand(tokens, k, -1) reshaped to [T*k, 1, H] met OpenVINO's
    # frontend as a MatMul of a [.., 1] row by the 64-row weight, "Incompatible MatMul matrix dimension")
    x = states.repeat_interleave(k, dim=0)[:, :, None]  # [T*k, H, 1]
    gate = self.mlp.activation_fn(torch.matmul(w1, x))  # [T*k, F, 1]
    out = torch.matmul(w2.transpose(1, 2), gate * torch.matmul(v1, x))  # [T*k, H, 1]
    out = (out.reshape(tokens, k, -1) * top_k_weights[..., None]).sum(1)
    return out.to(states.dtype).view(batch_size, -1, self.hidden_size)


@workaround(
    id="dbrx-batched-experts",
    backend="all",
    target=f"{_DBRX}.DbrxExperts.forward",
    breaks="the loop over the experts hit (nonzero() of the routing mask) makes an unbacked count that torch.export "
    "cannot guard on (GuardOnDataDependentSymNode: Eq(u0, 0))",
    upstream="transformers models/dbrx/modeling_dbrx.py DbrxExperts.forward; no issue known",
    versions={"transformers": ">=5.0,<5.24"},
    applies=lambda model, inputs: uses_class(model, _DBRX, "DbrxExperts"),
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    return patch_attribute(sys.modules[_DBRX].DbrxExperts, "forward", _batched_experts)
