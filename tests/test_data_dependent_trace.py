"""A model that branches on tensor values (capture/trace.py): traced on the sample's branch where the runtime checks
the program's runtime assertions (Dynamo), refused where the lowering drops them (ONNX)."""

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


def test_a_backend_that_drops_runtime_assertions_keeps_the_trace_error(longformer):
    pytest.importorskip("onnxscript", reason="ONNX backend extra not installed (pip install 'hfexport[onnx]')")
    from hfexport import OnnxConfig, OnnxExporter

    model, local, _ = longformer
    with pytest.raises(ExportError, match="GuardOnDataDependentSymNode") as info:
        OnnxExporter().export(model, local, OnnxConfig(dynamic=False))
    assert info.value.stage == "trace"
