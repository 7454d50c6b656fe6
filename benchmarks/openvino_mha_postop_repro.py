"""Upstream repro (OpenVINO CPU, Snippets MHA): a broadcasting element-wise op after SDPA is fused wrong at head size >= 128.

``python benchmarks/openvino_mha_postop_repro.py`` builds a bare ``ScaledDotProductAttention`` (dynamic sequence
length, boolean causal mask) followed by ``select(mask.any(-1), out, 0)`` and prints the max abs difference against
torch for head sizes 64/128/256, as compiled by default, with ``SNIPPETS_MODE=DISABLE``, and with the condition
broadcast explicitly, as ``hfexport.workarounds.openvino_mha_postops``. Measured 2026-12-02 (openvino 2026.3.1, AMD EPYC
with AVX-512): head 64 5e-7; head 128 3.1 and head 256 3.6 by default; 8e-7 / 2e-6 with Snippets off or with the
explicit broadcast (the same at 520 tokens with static shapes, where a no-op ``Reshape`` fence is folded away). No hfexport export involved: this is the report to file upstream.
"""

from __future__ import annotations

import numpy as np


def build(head: int, fence: bool, tokens: int = -1):
    import openvino as ov
    import openvino.opset13 as ops

    q, k, v = (ops.parameter([1, 4, tokens, head], np.float32) for _ in range(3))
    mask = ops.parameter([1, 1, tokens, tokens], ov.Type.boolean)
    out = ops.scaled_dot_product_attention(q, k, v, mask, ops.constant(np.float32(head ** -0.5)), causal=False)
    any_key = ops.reduce_logical_or(mask, ops.constant(np.int64(-1)), keep_dims=True)
    if fence:
        any_key = ops.broadcast(any_key, ops.shape_of(out))
    return ov.Model([ops.select(any_key, out, ops.constant(np.float32(0)))], [q, k, v, mask])


def max_diff(head: int, fence: bool = False, properties: dict | None = None, tokens: int = 9,
             static: bool = False) -> float:
    import openvino as ov
    import torch

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 4, tokens, head)).astype(np.float32) for _ in range(3))
    mask = np.tril(np.ones((tokens, tokens), bool))[None, None]
    want = torch.nn.functional.scaled_dot_product_attention(*map(torch.from_numpy, (q, k, v, mask))).numpy()
    compiled = ov.Core().compile_model(build(head, fence, tokens if static else -1), "CPU", {"INFERENCE_PRECISION_HINT": "f32", **(properties or {})})
    return float(np.abs(compiled([q, k, v, mask])[0] - want).max())


if __name__ == "__main__":
    for head in (64, 128, 256):
        print(f"head {head}: default {max_diff(head):.2g}, SNIPPETS_MODE=DISABLE "
              f"{max_diff(head, properties={'SNIPPETS_MODE': 'DISABLE'}):.2g}, broadcast {max_diff(head, fence=True):.2g}; "
              f"static 520 tokens: default {max_diff(head, tokens=520, static=True):.2g}, "
              f"broadcast {max_diff(head, fence=True, tokens=520, static=True):.2g}")
