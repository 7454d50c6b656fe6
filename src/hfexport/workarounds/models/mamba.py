"""Mamba: keep the sequence length symbolic through the selective scan.

transformers' CPU fallback of the selective scan is a Python loop over the sequence (``for index in
range(seq_len)``), so ``torch.export`` unrolls it and pins the prompt length to the traced one (guard
``Eq(seq, 7)``); its ``associative_scan`` alternative is disabled under export because ONNX has no translation.
During the trace we swap in the closed form of the same recurrence: with ``a_t = A * dt_t`` (the log of the
discretised decay) and ``c_t = cumsum(a)_t``, the state is ``h_t = sum_{s<=t} exp(c_t - c_s) * dB_s x_s``.
That is cumsum, exp, a masked sum and an einsum — ops every backend lowers — and it keeps the length symbolic.
It is computed in chunks of 16 steps (the closed form inside a chunk, then over the chunks' end states, as
Mamba-2's SSD does), so the prefill's memory grows as L * (16 + L / 16), not L^2; the decode step (L=1) does
not call the scan.
Drop this once transformers' scan exports with a symbolic length.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..registry import patch_attribute, workaround

__all__ = ["closed_form_selective_scan", "CHUNK"]

_MODULE = "transformers.models.mamba.modeling_mamba"
CHUNK = 16


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
    length = hidden_states.shape[-1]
    states = _chunked_states(log_decay, drive, length)
    scan_output = torch.einsum("bdtn,btn->bdt", states.to(input_dtype), c_t.to(input_dtype))
    if D is not None:
        scan_output = scan_output + hidden_states * D[None, :, None]
    if z is not None:
        scan_output = scan_output * F.silu(z)
    if return_last_state:
        return scan_output, states[:, :, -1].to(input_dtype)
    return scan_output


def _causal_sum(log_decay: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
    """``h_t = sum_{s<=t} exp(c_t - c_s) * drive_s`` along dim 2 (``c = cumsum(log_decay)``), zero initial state:
    ``[..., T, n]`` in, ``[..., T, n]`` out, with a ``T x T`` weight (every exponent a sum of decays, <= 0)."""
    cum = torch.cumsum(log_decay, dim=2)
    steps = torch.arange(cum.shape[2], device=cum.device)
    causal = steps[:, None] >= steps[None, :]  # [t, s]
    gap = cum.unsqueeze(3) - cum.unsqueeze(2)  # [..., t, s, n]
    weights = torch.where(causal[:, :, None], gap, torch.full_like(gap, float("-inf"))).exp()
    return torch.einsum("...tsn,...sn->...tn", weights, drive)


def _chunked_states(log_decay: torch.Tensor, drive: torch.Tensor, length: Any) -> torch.Tensor:
    """The scan's states ``[b, d, L, n]`` in chunks of :data:`CHUNK` steps, as Mamba-2's SSD computes them: the
    closed form inside each chunk, the same closed form over the chunks' end states, then each chunk's entering
    state decayed into its steps. Memory ``b d L n (CHUNK + L / CHUNK)`` instead of ``b d L^2 n`` (ExecuTorch plans
    every tensor at its bounds: 25.8 GB for the tiny model's prefill at batch 8 x 512 steps, now 0.94 GB); the
    padding steps (no decay, no input) leave the states as they are. At least three chunks, the last two padding
    only, so that no size of the chunk axis is 1 at trace time: torch.export specialises a size seen as 1 (its 0/1
    rule), and XNNPACK's channels-last pass guards on a dim equal to 1 (``is_contiguous``), either of which pinned
    the prompt length below one chunk."""
    chunks = length // CHUNK + 3
    padded = chunks * CHUNK  # (written as a product, the sizes below stay exact: CHUNK is no quotient of sizes)
    log_decay = F.pad(log_decay, (0, 0, 0, padded - length))
    drive = F.pad(drive, (0, 0, 0, padded - length))
    b, d, _, n = drive.shape
    log_decay = log_decay.reshape(b, d, chunks, CHUNK, n)
    local = _causal_sum(log_decay.flatten(1, 2), drive.reshape(b, d * chunks, CHUNK, n)).reshape(
        b, d, chunks, CHUNK, n)  # each chunk from a zero state
    within = torch.cumsum(log_decay, dim=3)  # decay from the chunk's start to each step
    ends = _causal_sum(within[:, :, :, -1], local[:, :, :, -1])  # [b, d, chunks, n]: the state after each chunk
    entering = torch.cat([torch.zeros_like(ends[:, :, :1]), ends[:, :, :-1]], dim=2)
    states = local + within.exp() * entering[:, :, :, None]
    return states.reshape(b, d, padded, n)[:, :, :length]


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
