"""LongCat-Flash: trace its experts (routed plus identity "zero" experts) without a loop over the experts hit.

``LongcatFlashExperts.forward`` (transformers' modeling_longcat_flash.py) loops ``for expert_idx_tensor in
expert_hit`` over ``nonzero()`` of the routing mask and calls ``.item()`` on each index: torch.export cannot guard
on the data-dependent count ("Could not guard on data-dependent expression Eq(u0, 0)"). The class is LongCat's own
(identity experts beside the routed ones), not transformers' experts interface, so ``set_experts_implementation``
cannot switch it. While tracing, each token's ``top_k`` choices are computed at once instead: the chosen routed
experts' weights gathered per (token, choice) and applied with batched matmuls (what transformers' ``batched_mm``
experts do), an identity expert's output being the token itself, then weighted and summed. Same result up to the
order of the additions. Drop it once LongCat's experts use transformers' experts interface.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..registry import patch_attribute, uses_class, workaround

_LONGCAT = "transformers.models.longcat_flash.modeling_longcat_flash"


def _batched_experts(self: Any, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                     top_k_weights: torch.Tensor) -> torch.Tensor:
    """``LongcatFlashExperts.forward`` without data-dependent control flow: every (token, choice) pair at once."""
    if self.gate_up_proj is None:  # identity experts only
        return (hidden_states[:, None, :] * top_k_weights[..., None]).sum(1).to(hidden_states.dtype)
    routed = top_k_index < self.num_routed_experts
    index = torch.where(routed, top_k_index, torch.zeros_like(top_k_index))
    tokens, k = index.shape
    # (each token repeated k times as a row: an expand(tokens, k, -1) reshaped to [T*k, 1, H] ran on OpenVINO's CPU
    # plugin with a shape its Select then refused, "Eltwise shape infer input shapes dim index: 0 mismatch"; the
    # gathered weights on the right of the product: on their left, as columns, ExecuTorch planned 7.5 GiB at batch 8 x
    # 512 positions and refused to load; this way it loads and generates eager's tokens)
    states = hidden_states.repeat_interleave(k, dim=0)[:, None, :]  # [T*k, 1, H]
    gate_up = torch.bmm(states, self.gate_up_proj[index.reshape(-1)].transpose(1, 2))  # [T*k, 1, 2I]
    gate, up = gate_up.chunk(2, dim=-1)
    out = torch.bmm(self.act_fn(gate) * up, self.down_proj[index.reshape(-1)].transpose(1, 2))  # [T*k, 1, H]
    out = torch.where(routed[..., None], out.reshape(tokens, k, -1), hidden_states[:, None, :])
    return (out * top_k_weights[..., None]).sum(1).to(hidden_states.dtype)


@workaround(
    id="longcat-flash-batched-experts",
    backend="all",
    target=f"{_LONGCAT}.LongcatFlashExperts.forward",
    breaks="the loop over the experts hit (nonzero() then .item() per expert) makes an unbacked count that "
    "torch.export cannot guard on (GuardOnDataDependentSymNode: Eq(u0, 0))",
    upstream="transformers models/longcat_flash/modeling_longcat_flash.py LongcatFlashExperts.forward; no issue known",
    versions={"transformers": ">=5.0,<5.24"},
    applies=lambda model, inputs: uses_class(model, _LONGCAT, "LongcatFlashExperts"),
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    return patch_attribute(sys.modules[_LONGCAT].LongcatFlashExperts, "forward", _batched_experts)
