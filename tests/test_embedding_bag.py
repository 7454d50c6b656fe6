"""Fixed-size embedding bags of a dynamic count (workarounds openvino-embedding-bag, executorch-embedding-bag)."""

from __future__ import annotations

import pytest
import torch


class _Bags(torch.nn.Module):
    """Kimi-K2.5's position table in small: fixed-size weighted bags over a table, as many as the input has rows."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(20, 8))

    def forward(self, indices: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.embedding_bag(indices, self.table, per_sample_weights=weights, mode="sum")


def test_fixed_size_bags_of_a_dynamic_count_compile_and_match_eager_on_openvino(monkeypatch):
    """The CPU plugin could not compile EmbeddingBagOffsets over a dynamic bag input ("to_shape was called on a
    dynamic shape"; checked below with the rewrite off); openvino-embedding-bag gathers and sums instead."""
    pytest.importorskip("openvino", reason="the OpenVINO backend's own package (pip install hfexport[openvino])")
    from hfexport import OpenVINOConfig, OpenVINOExporter
    from hfexport.workarounds import embedding_bag

    torch.manual_seed(0)
    model = _Bags()

    def sample(rows: int) -> dict:
        return {"indices": torch.randint(0, 20, (rows, 4)), "weights": torch.rand(rows, 4)}

    exported = OpenVINOExporter().export(model, sample(6), OpenVINOConfig(dynamic=True))
    assert "openvino-embedding-bag" in exported.components["model"].metadata.workarounds
    for rows in (6, 3, 11):
        inputs = sample(rows)
        assert torch.allclose(exported(**inputs), model(**inputs), atol=1e-5), rows

    monkeypatch.setattr(embedding_bag, "bags_as_gather", lambda original: original)
    unfixed = OpenVINOExporter().export(model, sample(6), OpenVINOConfig(dynamic=True))
    with pytest.raises(RuntimeError, match="to_shape was called on a dynamic shape"):
        unfixed(**sample(6))



def test_fixed_size_bags_load_and_match_eager_on_executorch(monkeypatch):
    """ExecuTorch has no kernel for aten._embedding_bag: the method failed to load (error 0x14; checked below with
    the rewrite off); executorch-embedding-bag gathers and sums instead."""
    pytest.importorskip("executorch", reason="the ExecuTorch backend's own package (pip install hfexport[executorch])")
    from hfexport import ExecutorchConfig, ExecutorchExporter
    from hfexport.workarounds import embedding_bag

    torch.manual_seed(0)
    model = _Bags()
    inputs = {"indices": torch.randint(0, 20, (6, 4)), "weights": torch.rand(6, 4)}
    exported = ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=False))
    assert "executorch-embedding-bag" in exported.components["model"].metadata.workarounds
    assert torch.allclose(exported(**inputs), model(**inputs), atol=1e-5)

    monkeypatch.setattr(embedding_bag, "bags_as_gather", lambda original: original)
    unfixed = ExecutorchExporter().export(model, inputs, ExecutorchConfig(dynamic=False))
    with pytest.raises(RuntimeError, match="0x:?14"):
        unfixed(**inputs)
