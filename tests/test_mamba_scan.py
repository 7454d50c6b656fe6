"""The selective scan hfexport traces for Mamba (workaround mamba-symbolic-scan): chunked closed form against the
recurrence it replaces, step by step, at lengths inside one chunk, on chunk boundaries and across several chunks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hfexport.workarounds.models.mamba import CHUNK, closed_form_selective_scan


def _recurrence(u, dt, A, B, C, D, z):
    """``h_t = exp(A dt_t) h_{t-1} + dt_t B_t u_t``, ``y_t = C_t h_t + D u_t``, gated by ``silu(z)``: one step at a
    time, as transformers' CPU fallback loops."""
    dt = F.softplus(dt)
    h = torch.zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[-1]):
        h = torch.exp(A * dt[:, :, t, None]) * h + dt[:, :, t, None] * B[:, None, :, t] * u[:, :, t, None]
        ys.append((h * C[:, None, :, t]).sum(-1))
    return (torch.stack(ys, -1) + u * D[None, :, None]) * F.silu(z), h


@pytest.mark.parametrize("length", [1, 5, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 7, 100])
def test_the_chunked_scan_follows_the_recurrence(length):
    gen = torch.Generator().manual_seed(length)
    b, d, n = 2, 6, 4
    u, dt, z = (torch.randn(b, d, length, generator=gen) for _ in range(3))
    A = -3 * torch.rand(d, n, generator=gen)  # (log A of a real checkpoint: negative decays)
    B, C = torch.randn(b, n, length, generator=gen), torch.randn(b, n, length, generator=gen)
    D = torch.randn(d, generator=gen)
    got, last = closed_form_selective_scan(u, dt, A, B, C, D, z, delta_softplus=True, return_last_state=True)
    want, want_last = _recurrence(u, dt, A, B, C, D, z)
    assert (got - want).abs().max() < 1e-4 and (last - want_last).abs().max() < 1e-4
