"""Longformer's sliding-window attention exported with a dynamic sequence (workaround ``*-longformer-windows``):
its overlapping chunks are ``as_strided`` views over symbolic strides upstream, which OpenVINO's frontend and
torch.onnx's decomposition refuse; as ``unfold`` they export and give eager's outputs at another length too."""

from __future__ import annotations

import pytest
import torch
from transformers import LongformerConfig, LongformerModel

from hfexport import OnnxConfig, OnnxExporter, OpenVINOConfig, OpenVINOExporter


def _model() -> LongformerModel:
    torch.manual_seed(0)
    config = LongformerConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                              intermediate_size=64, attention_window=4, max_position_embeddings=64, pad_token_id=1)
    return LongformerModel(config, add_pooling_layer=False).eval()


def _inputs(length: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(2, length, dtype=torch.long)
    mask[1, -3:] = 0  # a padded row
    return {"input_ids": torch.randint(2, 99, (2, length), generator=gen), "attention_mask": mask}


@pytest.mark.parametrize(("exporter", "config", "upstream"), [
    pytest.param(OnnxExporter, OnnxConfig, "decompose", marks=pytest.mark.sweep),  # (70 s: the matrix's rows run it)
    pytest.param(OpenVINOExporter, OpenVINOConfig, "sym_stride|not dense in memory", marks=pytest.mark.sweep),
], ids=["onnx", "openvino"])
def test_a_dynamic_longformer_exports_and_matches_eager_at_another_length(exporter, config, upstream,
                                                                          without_workaround):
    model = _model()
    sample, other = _inputs(8, 0), _inputs(16, 1)
    exported = exporter().export(model, sample, config(dynamic=True))
    workaround_id = f"{exporter.export_format}-longformer-windows"
    assert workaround_id in exported.components["model"].metadata.workarounds
    for inputs in (sample, other):
        with torch.no_grad():
            want = model(**inputs).last_hidden_state
        got = exported(**inputs).last_hidden_state
        assert got.shape == want.shape and (got - want).abs().max().item() <= 1e-4

    without_workaround(workaround_id)
    with pytest.raises(Exception, match=upstream):  # the premise: the strided windows do not convert
        exporter().export(model, sample, config(dynamic=True))
