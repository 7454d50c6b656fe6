"""The rewrites that let XNNPACK take a whole layer (backends/executorch/delegable.py): same numbers, fewer cuts."""

from __future__ import annotations

import pytest
import torch

from hfexport.testing.tiny import TINY_CASES

pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")

from hfexport.backends.executorch.delegable import make_delegable, signed_half_rotation  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_signed_rotation_is_rotate_half_bit_for_bit(dtype):
    x = torch.randn(2, 3, 5, 64).to(dtype)
    x[0, 0, 0, :4] = torch.tensor([1e30, -1e-30, 0.0, -0.0]).to(dtype)
    expected = torch.cat((-x[..., 32:], x[..., :32]), dim=-1)
    got = torch.nn.functional.linear(x, signed_half_rotation(64, dtype))
    assert torch.equal(got, expected)


class _Forward(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits


def _ops(program, name: str) -> int:
    return sum(1 for n in program.graph.nodes if n.op == "call_function" and name in str(n.target))


def test_a_llama_forward_keeps_its_numbers_and_loses_the_ops_xnnpack_refuses():
    case = TINY_CASES["llama"]
    model = case.build()
    layers = model.config.num_hidden_layers
    inputs = case.inputs(1, 7, padded=False)
    seq = torch.export.Dim("seq", min=2, max=64)
    program = torch.export.export(_Forward(model), (), dict(inputs),
                                  dynamic_shapes={"input_ids": {1: seq}, "attention_mask": {1: seq}})
    assert _ops(program, "aten.slice.Tensor") >= 4 * layers and _ops(program, "aten.mean.dim") == 2 * layers + 1
    symbolic_views = [n for n in program.graph.nodes if n.target is torch.ops.aten.view.default
                      and not all(isinstance(d, int) for d in n.args[1])]
    assert len(symbolic_views) >= 3 * layers  # q, k, v each viewed as (batch, seq, heads, head_dim)
    counts = make_delegable(program)
    assert counts["rotate_half"] == 2 * layers and counts["mean"] == 2 * layers + 1, counts
    assert counts["view"] >= 3 * layers, counts
    assert _ops(program, "aten.mean.dim") == 0 and _ops(program, "aten.neg") == 0
    assert all(isinstance(d, int) for n in program.graph.nodes if n.target is torch.ops.aten.view.default
               for d in n.args[1])
    for length in (7, 13):  # another length than the traced one: the views' -1 still follows the dynamic dim
        longer = case.inputs(1, length, padded=False)
        with torch.no_grad():
            expected = model(**longer, use_cache=False).logits
        got = program.module()(**longer)
        assert got.shape == expected.shape
        assert (got - expected).abs().max().item() <= 1e-5


def test_a_program_without_the_patterns_is_left_as_it_is():
    class Other(torch.nn.Module):
        def forward(self, x):  # a slice and a mean, but neither rotate_half nor a last-dim mean with keepdim
            return torch.cat((x[..., 1:], x[..., :1]), -1) + x.mean(dim=-1, keepdim=False).unsqueeze(-1)

    program = torch.export.export(Other(), (torch.randn(2, 8),))
    before = program.graph_module.code
    assert make_delegable(program) == {"rotate_half": 0, "mean": 0, "view": 0, "alias": 0}
    assert program.graph_module.code == before


class _OutputAndItsCopy(torch.nn.Module):
    """PE Audio's encoder in small: one value returned as it is and as a copy (``.clone()``/``.contiguous()``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.linear(x)
        return hidden * 2, hidden, hidden.clone()


def test_a_partition_returning_a_value_and_its_copy_lowers_and_matches_eager(monkeypatch):
    """XNNPACK's passes removed the copy and the partition returned one node twice, which its serializer refused
    ("Output node ... is already in the inputs"; checked below with the rewrite off); the repeat is copied back."""
    from hfexport import ExecutorchConfig, ExecutorchExporter
    from hfexport.workarounds import executorch_xnnpack_repeated_outputs

    model, x = _OutputAndItsCopy(), torch.randn(2, 4, 8)
    exported = ExecutorchExporter().export(model, {"x": x}, ExecutorchConfig(dynamic=False))
    got, want = exported(x=x), model(x)
    assert len(got) == 3 and all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want))
    assert got[1].data_ptr() != got[2].data_ptr()  # two outputs, two buffers

    monkeypatch.setattr(executorch_xnnpack_repeated_outputs, "copy_repeated_outputs", lambda program: 0)
    with pytest.raises(Exception, match="already in the inputs"):
        ExecutorchExporter().export(model, {"x": x}, ExecutorchConfig(dynamic=False))
