"""onnxscript's clip-fusion rules name the bounds they create after the clamped value (``<input>_min``): two fused
clamps of one value made two constants of one name, and the ONNX model was invalid ("Node input 'mul_8_min' is not a
graph input, initializer, or output of a previous node", Gemma 4's audio tower). hfexport's optimiser registers such
constants under fresh names (workaround onnx-rewrite-initializer-names)."""

from __future__ import annotations

import pytest
import torch


class TwoClampedCopies(torch.nn.Module):
    """Two successive clamps of one value, twice, to different bounds (each pair fuses into one Clip of ``y``)."""

    def forward(self, x):
        y = x * 3
        return torch.clamp(torch.clamp(y, -3.0, 3.0), -2.0, 2.0) + torch.clamp(torch.clamp(y, -4.0, 4.0), -1.0, 1.0)


def test_two_fused_clamps_of_one_value_give_a_valid_model_that_matches_eager():
    pytest.importorskip("onnxscript", reason="the onnx extra is not installed")
    from hfexport import OnnxConfig, OnnxExporter

    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    exported = OnnxExporter().export(TwoClampedCopies(), {"x": x}, OnnxConfig(dynamic=True))
    (component,) = exported.components.values()
    graph = component.program.graph
    clips = [n for n in graph if n.op_type == "Clip"]
    assert len(clips) == 2 and all(n.inputs[0] is clips[0].inputs[0] for n in clips)  # fused, on one value
    bounds = [v for n in clips for v in n.inputs[1:]]
    assert all(graph.initializers.get(v.name) is v for v in bounds)  # each bound is an initializer of its own name
    got = exported(x=x)
    got = got[0] if isinstance(got, (tuple, list)) else got
    assert torch.equal(got, TwoClampedCopies()(x))
