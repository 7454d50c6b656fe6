"""A model that branches on tensor values (capture/trace.py): traced on the sample's branch, the other branch refused
by name, through the program's runtime assertions (Dynamo) or boolean outputs its runner checks (capture/assumptions.py:
ONNX, OpenVINO, ExecuTorch, AOTInductor)."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.errors import ExportError, UnsupportedError
from hfexport.tools.matrix.shrink import build_model


@pytest.fixture(scope="module")
def longformer():
    model = build_model("longformer", "LongformerForMaskedLM")
    ids = torch.randint(3, 200, (2, 6), generator=torch.Generator().manual_seed(0))
    local = {"input_ids": ids, "attention_mask": torch.ones(2, 6, dtype=torch.long)}
    glob = {"input_ids": ids, "attention_mask": local["attention_mask"].clone()}
    glob["attention_mask"][:, 3] = 2  # Longformer: 2 marks a token with global attention (`if is_global_attn:`)
    return model, local, glob


def test_a_data_dependent_branch_is_traced_on_the_sample_and_the_other_branch_refused_by_name(longformer, caplog):
    model, local, glob = longformer
    with torch.no_grad():
        eager_local, eager_global = model(**local).logits, model(**glob).logits
    assert (eager_local - eager_global).abs().max() > 1e-3  # the branch changes eager's result

    with caplog.at_level("WARNING", logger="hfexport.capture.trace"):
        exported = DynamoExporter().export(model, local, DynamoConfig(dynamic=False))
    assert "branches on tensor values" in caplog.text and "Ne(u0, 1)" in caplog.text
    with torch.no_grad():
        assert (exported(**local).logits - eager_local).abs().max() <= 1e-4
    with pytest.raises(UnsupportedError, match=r"another branch .* Ne\(u0, 1\)"):
        exported(**glob)


class Branchy(torch.nn.Module):
    """Branches on a value of its input: doubles a positive sum, else subtracts one."""

    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x - 1


_BACKENDS = {"onnx": ("OnnxExporter", "OnnxConfig", "onnxscript"),
             "openvino": ("OpenVINOExporter", "OpenVINOConfig", "openvino"),
             "executorch": ("ExecutorchExporter", "ExecutorchConfig", "executorch"),
             "aoti": ("AotiExporter", "AotiConfig", "torch")}


@pytest.mark.parametrize("fmt", ["onnx", "openvino",  # (ExecuTorch 17 s, AOTI a 25 s compile: the sweep's)
                                 pytest.param("executorch", marks=pytest.mark.sweep),
                                 pytest.param("aoti", marks=pytest.mark.sweep)])
def test_a_backend_that_drops_runtime_assertions_returns_them_as_checks_its_runner_makes(fmt, tmp_path):
    import hfexport
    from hfexport.metadata import IORole

    exporter_name, config_name, package = _BACKENDS[fmt]
    pytest.importorskip(package, reason=f"the {fmt} backend's extra is not installed (pip install 'hfexport[{fmt}]')")
    model, positive, negative = Branchy(), {"x": torch.full((2, 3), 0.5)}, {"x": -torch.ones(2, 3)}
    assert not torch.equal(model(**positive), positive["x"] - 1)  # the branch changes eager's result

    exported = getattr(hfexport, exporter_name)().export(model, {"x": torch.ones(2, 3)}, getattr(hfexport, config_name)())
    assert "Eq(u0, 1)" in exported.components["model"].metadata.assumptions
    checks = [s for s in exported.components["model"].metadata.outputs if s.role is IORole.CHECK]
    assert len(checks) == len(exported.components["model"].metadata.assumptions) and [s.dtype for s in checks] == ["bool"] * len(checks)
    assert torch.equal(exported(**positive), model(**positive))  # the checks are not among the model's outputs
    with pytest.raises(UnsupportedError, match=r"another branch of Branchy.*Eq\(u0, 1\)"):
        exported(**negative)
    exported.save_pretrained(tmp_path)
    reloaded = hfexport.ExportedModel.from_pretrained(tmp_path, trust_remote_code=fmt == "aoti")  # (its own code)
    assert torch.equal(reloaded(**positive), model(**positive))
    with pytest.raises(UnsupportedError, match=r"Eq\(u0, 1\)"):
        reloaded(**negative)


def test_assumptions_are_computed_with_tensor_ops_only():
    """OpenVINO's frontend converts no symbolic scalar op (operator.eq, sym_not, sym_ite): none may be left."""
    from hfexport import DynamoConfig
    from hfexport.capture.trace import trace_program

    program, assumptions = trace_program(Branchy(), {"x": torch.ones(2, 3)}, None, DynamoConfig(),
                                         checks_runtime_asserts=False)
    assert "Eq(u0, 1)" in assumptions
    calls = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten._assert_scalar.default not in calls
    assert all(isinstance(t, torch._ops.OpOverload) for t in calls), calls
    flat = program.module()(x=torch.ones(2, 3))
    assert torch.equal(flat[0], torch.full((2, 3), 2.0)) and all(bool(c) for c in flat[1])
    assert not all(bool(c) for c in program.module()(x=-torch.ones(2, 3))[1])


class PackedSlices(torch.nn.Module):
    """MiniCPM-V's per-image slices of its packed patches, at offsets read from a tensor, after a branch on a value
    (so the trace falls back to the sample's real values)."""

    def forward(self, packed, sizes):
        if sizes[0] > 100:
            packed = packed * 2
        out, start = [], 0
        for n in sizes.tolist():
            out.append(packed[0, start:start + n].sum(0))
            start += n
        return torch.stack(out)


def test_a_slice_at_an_offset_read_from_a_tensor_traces_with_real_values():
    """torch-real-tensor-offsets: torch compared the slice's unbacked storage offset with != and the fallback trace
    raised the very guard it is for (MiniCPM-V, EnCodec)."""
    model, inputs = PackedSlices(), {"packed": torch.randn(1, 10, 4), "sizes": torch.tensor([4, 6])}
    exported = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=False))
    assert "torch-real-tensor-offsets" in exported.components["model"].metadata.workarounds
    assert torch.allclose(exported(**inputs), model(**inputs), atol=1e-6)


def test_a_slices_storage_offset_is_not_among_the_checks_a_runtime_makes(monkeypatch):
    """torch asserts ``storage_offset >= 0`` of a slice at an unbacked start; OpenVINO's frontend has no rule for
    ``aten.sym_storage_offset`` ("No conversion rule found", MiniCPM-OCR), and the check holds for every tensor."""
    pytest.importorskip("openvino", reason="the OpenVINO backend's own package (pip install hfexport[openvino])")
    from hfexport import OpenVINOConfig, OpenVINOExporter
    from hfexport.capture import assumptions

    model, inputs = PackedSlices(), {"packed": torch.randn(1, 10, 4), "sizes": torch.tensor([4, 6])}
    kept = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=False)).program
    assert any(n.target is torch.ops.aten.sym_storage_offset.default for n in kept.graph.nodes)  # Dynamo asserts it
    exported = OpenVINOExporter().export(model, inputs, OpenVINOConfig(dynamic=False))
    assert "Ne(u0, 1)" in exported.components["model"].metadata.assumptions  # the branch is still checked
    assert torch.allclose(exported(**inputs), model(**inputs), atol=1e-6)

    monkeypatch.setattr(assumptions, "_holds_always", lambda condition: False)
    with pytest.raises(ExportError, match="sym_storage_offset"):
        OpenVINOExporter().export(model, inputs, OpenVINOConfig(dynamic=False))


class EntropyScore(torch.nn.Module):
    """BLT's patcher in small: the entropy of a Categorical built in the forward, which validates its logits."""

    def forward(self, logits):
        return torch.distributions.Categorical(logits=logits).entropy()


def test_a_distribution_built_in_the_forward_traces_without_branching_on_its_values(caplog):
    """distribution-validate-args: Categorical's check of its logits is a branch on tensor values; with it the trace
    fell back to the sample's real values (and BLT's export failed or passed from run to run)."""
    assert torch.distributions.Distribution._validate_args  # the premise: eager validates (python without -O)
    model, logits = EntropyScore(), torch.randn(2, 6, 16)
    with caplog.at_level("WARNING"):
        exported = DynamoExporter().export(model, {"logits": logits}, DynamoConfig(dynamic=False))
    assert "distribution-validate-args" in exported.components["model"].metadata.workarounds
    assert not [r for r in caplog.records if "branches on tensor values" in r.getMessage()]
    assert torch.distributions.Distribution._validate_args  # restored after the export
    other = torch.randn(2, 6, 16)
    assert torch.allclose(exported(logits=other), model(other), atol=1e-5)


class HalvedGrid(torch.nn.Module):
    """MiniCPM-V 4.6's image features in small: a size read from its grid (``int()``, so the trace falls back to the
    sample's real values), then the grid of every image halved by integer floor division."""

    def forward(self, patches, sizes):
        first = int(sizes[0, 0])
        halved = sizes // 2
        return patches[:, :first] * (halved[:, 0] * halved[:, 1]).sum()


def test_integer_floor_division_at_symbolic_sizes_traces_with_real_values(without_workaround):
    """torch-prims-signbit-dtype: torch's reference of integer floor division asks prims.signbit, whose meta gave the
    input's int dtype where the real kernel gives bool; the fallback trace failed on the mismatch (MiniCPM-V 4.6 and
    4.7's target_sizes // 2)."""
    model = HalvedGrid()
    inputs = {"patches": torch.randn(2, 8, 3), "sizes": torch.tensor([[4, 6], [8, 2], [2, 2]], dtype=torch.int32)}
    shapes = {"patches": None, "sizes": {0: torch.export.Dim("images", min=2, max=16)}}
    exported = DynamoExporter().export(model, inputs, DynamoConfig(dynamic_shapes=shapes))
    assert "torch-prims-signbit-dtype" in exported.components["model"].metadata.workarounds
    other = {"patches": torch.randn(2, 8, 3), "sizes": torch.tensor([[4, 2], [6, 6]], dtype=torch.int32)}
    for sample in (inputs, other):  # (another count of images, the read size the same: the sample's branch)
        assert torch.allclose(exported(**sample), model(**sample), atol=1e-6)

    without_workaround("torch-prims-signbit-dtype")
    with pytest.raises(ExportError, match="Could not extract specialized integer"):
        DynamoExporter().export(model, inputs, DynamoConfig(dynamic_shapes=shapes))
