"""Mamba: keep the sequence length symbolic through the selective scan.

transformers' CPU fallback of the selective scan is a Python loop over the sequence (``for index in
range(seq_len)``), so ``torch.export`` unrolls it and pins the prompt length to the traced one (guard
``Eq(seq, 7)``); its ``associative_scan`` alternative is disabled under export because ONNX has no translation.
During the trace we swap in the closed form of the same recurrence: with ``a_t = A * dt_t`` (the log of the
discretised decay) and ``c_t = cumsum(a)_t``, the state is ``h_t = sum_{s<=t} exp(c_t - c_s) * dB_s x_s``.
That is cumsum, exp, a masked sum and an einsum — ops every backend lowers — and it keeps the length symbolic.
Cost: O(L^2) memory in the prefill, fine for prompts of a few hundred tokens; the decode step (L=1) is unchanged.
Drop this once transformers' scan exports with a symbolic length.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..registry import patch_attribute, workaround

__all__ = ["closed_form_selective_scan"]

_MODULE = "transformers.models.mamba.modeling_mamba"


def closed_form_selective_scan(
    hidden_states: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
    **_: Any,
) -> Any:
    """Same contract as ``mamba_selective_scan`` (zero initial state), without a loop over the sequence.

    Shapes: ``hidden_states``/``dt``: ``[b, d, L]``; ``A``: ``[d, n]``; ``B``/``C``: ``[b, n, L]``.
    """
    input_dtype = hidden_states.dtype
    if delta_bias is not None:
        dt = dt + delta_bias.to(dt.dtype)[..., None]
    if delta_softplus:
        dt = F.softplus(dt)
    b_t = B.transpose(1, 2).float()  # [b, L, n]
    c_t = C.transpose(1, 2)  # [b, L, n]
    log_decay = A[None, :, None, :] * dt[:, :, :, None]  # [b, d, L, n]
    drive = dt[:, :, :, None] * b_t[:, None, :, :] * hidden_states[:, :, :, None].float()  # [b, d, L, n]
    cum = torch.cumsum(log_decay, dim=2)
    length = hidden_states.shape[-1]
    steps = torch.arange(length, device=hidden_states.device)
    causal = steps[:, None] >= steps[None, :]  # [t, s]
    gap = cum[:, :, :, None, :] - cum[:, :, None, :, :]  # [b, d, t, s, n]
    weights = torch.where(causal[None, None, :, :, None], gap, torch.full_like(gap, float("-inf"))).exp()
    states = torch.einsum("bdtsn,bdsn->bdtn", weights, drive)  # [b, d, L, n]
    scan_output = torch.einsum("bdtn,btn->bdt", states.to(input_dtype), c_t.to(input_dtype))
    if D is not None:
        scan_output = scan_output + hidden_states * D[None, :, None]
    if z is not None:
        scan_output = scan_output * F.silu(z)
    if return_last_state:
        return scan_output, states[:, :, -1].to(input_dtype)
    return scan_output


def _applies(model: Any, inputs: dict) -> bool:
    import sys

    module = sys.modules.get(_MODULE)
    modules = getattr(model, "modules", None)
    return module is not None and modules is not None and any(type(m).__module__ == _MODULE for m in modules())


@workaround(
    id="mamba-symbolic-scan",
    backend="all",
    target=f"{_MODULE}.mamba_selective_scan",
    breaks="the Python loop over the sequence pins the prompt length under torch.export (guard Eq(seq, N))",
    upstream=None,
    versions={"transformers": ">=5.0,<5.24"},
    applies=_applies,
)
def _apply(model: Any, inputs: dict):
    import sys

    return patch_attribute(sys.modules[_MODULE], "mamba_selective_scan", closed_form_selective_scan)
