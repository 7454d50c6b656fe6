"""executorch-xnnpack-idle-passes: an XNNPACK preprocessing pass with nothing to rewrite in a partition is not run on
it, and the program written is the same, byte for byte, as without the workaround."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")

from hfexport.workarounds import executorch_xnnpack_idle_passes as idle  # noqa: E402
from hfexport.workarounds.registry import applied_workarounds  # noqa: E402

ID = "executorch-xnnpack-idle-passes"


class _Decoder(torch.nn.Module):
    """What a language model's partitions hold: linears, an RMS norm, SiLU, a softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return torch.softmax(self.down(torch.nn.functional.silu(self.up(h))), dim=-1)


class _Convolutional(torch.nn.Module):
    """What the seven passes are for: a 1-d convolution with a batch norm after it, a ReLU to fuse, a concatenation
    of six tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm = torch.nn.Conv1d(4, 6, 3), torch.nn.BatchNorm1d(6)
        self.norm.running_mean.normal_()
        self.norm.running_var.uniform_(0.5, 2.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm(self.conv(x)))
        return torch.cat([h[:, i : i + 1] * (i + 1) for i in range(6)], dim=1)


def _lower(module: torch.nn.Module, sample: torch.Tensor, skipped: list[str] | None) -> tuple[bytes, torch.Tensor]:
    """The ``.pte`` bytes of ``module`` lowered to XNNPACK and its output on ``sample``; with ``skipped`` (a list),
    under the workaround, which appends the passes it skipped."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from executorch.runtime import Runtime

    def lower() -> bytes:
        program = torch.export.export(module.eval(), (sample,))
        edge = to_edge_transform_and_lower(program, partitioner=[XnnpackPartitioner()])
        return edge.to_executorch().buffer

    if skipped is None:
        data = lower()
    else:
        original = idle.has_work

        def recorded(module_name: str, name: str, graph_module) -> bool:
            work = original(module_name, name, graph_module)
            if not work:
                skipped.append(name)
            return work

        idle.has_work = recorded
        try:
            with applied_workarounds(None, module, {}, ids=[ID]) as fired:
                assert fired == [ID]
                data = lower()
        finally:
            idle.has_work = original
    method = Runtime.get().load_program(data).load_method("forward")
    return data, method.execute([sample])[0]


@pytest.mark.parametrize("module, sample, idle_passes", [
    (_Decoder(), torch.randn(2, 5, 16), len(idle.IDLE_CHECKS)),
    (_Convolutional(), torch.randn(2, 4, 9), None),
], ids=["decoder", "convolutional"])
def test_the_skipped_passes_change_nothing_in_the_program(module, sample, idle_passes):
    torch.manual_seed(0)
    upstream, expected = _lower(module, sample, None)
    skipped: list[str] = []
    ours, got = _lower(module, sample, skipped)
    assert ours == upstream  # the same program, byte for byte
    with torch.no_grad():
        eager = module(sample)
    assert torch.allclose(got, eager, atol=1e-5) and torch.allclose(expected, eager, atol=1e-5)
    if idle_passes is not None:  # a decoder's partitions: every checked pass had nothing to do, and was skipped
        assert len(set(skipped)) == idle_passes, skipped
    else:  # the convolutional one keeps the passes it needs
        assert {"FuseBatchNormPass", "Conv1dUnsqueezePass", "FuseActivationPass", "DecomposeConcatenate"}.isdisjoint(
            skipped), skipped


def test_each_check_sees_the_op_its_pass_rewrites():
    """On edge graphs: a batch norm, a 1-d convolution, a ReLU and a six-way concatenation are each seen by the
    check of the pass that rewrites them, and not by the decoder's graph."""
    from executorch.exir import to_edge

    def edge(module: torch.nn.Module, sample: torch.Tensor):
        return to_edge(torch.export.export(module.eval(), (sample,))).exported_program().graph_module

    conv = edge(_Convolutional(), torch.randn(2, 4, 9))
    decoder = edge(_Decoder(), torch.randn(2, 5, 16))
    for module, name in [("decompose_batch_norm", "DecomposeBatchNorm"),
                         ("conv1d_unsqueeze_pass", "Conv1dUnsqueezePass"),
                         ("fuse_activation_pass", "FuseActivationPass"), ("decompose_cat", "DecomposeConcatenate")]:
        assert idle.has_work(module, name, conv), name
        assert not idle.has_work(module, name, decoder), name
    assert idle.has_work("convert_to_linear", "ConvertToLinearPass", decoder)  # (no check: always runs)
