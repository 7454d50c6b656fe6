"""delta-rule-block-inverse: the chunked gated delta rule's triangular system inverted in block steps while tracing
(workarounds/models/delta_rule_inverse.py), against torch's triangular solve and against eager Qwen3.5."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.workarounds.models.delta_rule_inverse import strictly_lower_inverse


@pytest.mark.parametrize("n", [64, 12])  # (a chunk of 64 in blocks; 12, not a power of two, row by row)
def test_the_block_inverse_is_the_triangular_solve(n):
    """Keys nearly alike (the hard case: a power series of the nilpotent part loses everything there)."""
    generator = torch.Generator().manual_seed(n)
    keys = torch.nn.functional.normalize(torch.randn(1, 16, generator=generator)
                                         + 0.01 * torch.randn(2, 3, n, 16, generator=generator), dim=-1)
    beta = torch.rand(2, 3, n, 1, generator=generator)
    lower = ((keys * beta) @ keys.transpose(-1, -2)).tril(-1)
    eye = torch.eye(n, dtype=torch.float64)
    expected = torch.linalg.solve_triangular(lower.double() + eye, eye.expand(2, 3, n, n), upper=False,
                                             unitriangular=True)
    assert (expected - eye).abs().max() > 0.5  # (far from the identity: the system couples the rows)
    got = strictly_lower_inverse(-lower) + torch.eye(n)
    assert (got.double() - expected).abs().max() <= 1e-5


@pytest.mark.parametrize("family, per_key_decay", [("qwen3_5", False), ("kimi_linear", True)])
def test_the_rewritten_function_computes_what_transformers_does(family, per_key_decay, monkeypatch):
    """Transformers' function and ours on the same inputs (two chunks, a final state), both on their export path:
    the same outputs, ours calling the block inverse once instead of the row loop."""
    import importlib
    import inspect

    from hfexport.workarounds.models import delta_rule_inverse

    module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    monkeypatch.setattr(module, "is_torchdynamo_exporting", lambda: True, raising=False)  # (Qwen3.5's loop branch)
    original = inspect.unwrap(getattr(module, delta_rule_inverse.FUNCTIONS[family]))
    calls = []
    block_inverse = delta_rule_inverse.strictly_lower_inverse
    monkeypatch.setattr(delta_rule_inverse, "strictly_lower_inverse",
                        lambda x: calls.append(x.shape) or block_inverse(x))
    generator = torch.Generator().manual_seed(0)
    batch, length, heads, k_dim, v_dim = 2, 70, 2, 16, 8
    query, key = (torch.randn(batch, length, heads, k_dim, generator=generator) for _ in range(2))
    value = torch.randn(batch, length, heads, v_dim, generator=generator)
    decay = -0.1 * torch.rand(batch, length, heads, *([k_dim] if per_key_decay else []), generator=generator)
    beta = torch.rand(batch, length, heads, generator=generator)
    arguments = dict(g=decay, beta=beta, output_final_state=True, use_qk_l2norm_in_kernel=True)
    expected = original(query, key, value, **arguments)
    got = delta_rule_inverse.rewritten(family)(query, key, value, **arguments)
    assert len(calls) == 1 and calls[0][-2:] == (64, 64)
    for want, have in zip(expected, got, strict=True):
        assert (have - want).abs().max() <= 1e-5


@pytest.mark.sweep  # (a Qwen3.5 traced twice, once with the loop unrolled: ~60 s)
def test_qwen3_5_traces_without_the_row_loop_and_matches_eager(without_workaround):
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    model = build_model("qwen3_5_text", "Qwen3_5ForCausalLM")
    ids = torch.randint(5, 100, (1, 70), generator=torch.Generator().manual_seed(1))  # (two chunks of 64)
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    exported = DynamoExporter().export(model, {"input_ids": ids}, DynamoConfig(dynamic=False))
    assert "delta-rule-block-inverse" in exported.components["model"].metadata.workarounds
    assert (exported(input_ids=ids).logits - expected).abs().max() <= 1e-4
    nodes = len(exported.program.graph.nodes)

    without_workaround("delta-rule-block-inverse")
    unrolled = DynamoExporter().export(model, {"input_ids": ids}, DynamoConfig(dynamic=False))
    assert len(unrolled.program.graph.nodes) > 2 * nodes  # (the loop: 63 rows per linear-attention layer)
