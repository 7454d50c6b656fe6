"""Encoder-decoder forecasters (Time Series Transformer, Autoformer): the decoder's future values are an input of
the export, not a label, and Autoformer's encoder traces without a mask eager never builds (issue 22)."""

from __future__ import annotations

import pytest
import torch

from hfexport import DynamoConfig
from hfexport.errors import ExportError
from hfexport.exporter_dynamo import DynamoExporter
from hfexport.hf_model import label_keys
from hfexport.tools.matrix.inputs import sample_inputs
from hfexport.tools.matrix.shrink import build_model


def _model_and_inputs(model_type: str, class_name: str):
    torch.manual_seed(0)
    model = build_model(model_type, class_name)
    return model, sample_inputs(model, model_type)


def test_an_encoder_decoder_forecaster_exports_with_its_future_values_as_the_decoder_input():
    model, inputs = _model_and_inputs("time_series_transformer", "TimeSeriesTransformerModel")
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
        without = model(**{k: v for k, v in inputs.items() if k != "future_values"}).last_hidden_state
    assert expected.shape[1] == inputs["future_values"].shape[1] == 4
    assert without.shape[1] == 1  # the premise: without them the decoder has one position, not the horizon's
    exported = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
    got = exported(**inputs).last_hidden_state
    assert got.shape == expected.shape
    assert (got - expected).abs().max() <= 1e-4
    other = {**inputs, "future_values": torch.randn_like(inputs["future_values"])}
    with torch.no_grad():
        assert (exported(**other).last_hidden_state - model(**other).last_hidden_state).abs().max() <= 1e-4


def test_future_values_stay_a_label_of_a_forecaster_without_a_decoder():
    assert "future_values" in label_keys(build_model("patchtst", "PatchTSTModel").config)
    assert "future_values" not in label_keys(build_model("autoformer", "AutoformerModel").config)
    assert "labels" in label_keys(build_model("time_series_transformer", "TimeSeriesTransformerModel").config)


def test_autoformer_exports_without_the_all_true_mask_its_autocorrelation_cannot_take(without_workaround):
    model, inputs = _model_and_inputs("autoformer", "AutoformerModel")
    with torch.no_grad():
        expected = model(**inputs)
    exported = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
    assert "series-encoder-mask-skip" in exported.components["model"].metadata.workarounds
    got = exported(**inputs)
    for name in ("last_hidden_state", "encoder_last_hidden_state"):
        assert (getattr(got, name) - getattr(expected, name)).abs().max() <= 1e-4
    without_workaround("series-encoder-mask-skip")  # the premise: upstream's mask while exporting breaks its view
    with pytest.raises(ExportError, match=r"during trace failed: RuntimeError: shape '\[s\d+, 2, 4, 4\]' is invalid"):
        DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
