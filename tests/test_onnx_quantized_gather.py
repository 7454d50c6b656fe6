"""Quantized embedding lookups on ONNX (quantizers/onnx_gather.py): the int8 rows are gathered, then dequantized,
and a tied lm_head's transposed int8 copy serves the lookup, so the tied matrix is stored once."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from hfexport import AutoExportConfig, AutoHfExporter, ExportedModel
from hfexport.quantizers import onnx_gather
from hfexport.tools.measure import weight_bytes
from hfexport.quantizers.presets import recipe


@pytest.fixture(scope="module")
def tied():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 512, (2, 7), generator=torch.Generator().manual_seed(1))
    return model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _export(model, inputs, name, folder):
    config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})
    config.quantizer = recipe(name, "onnx", [inputs])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AutoHfExporter.from_config(config).export(model, dict(inputs), config).save_pretrained(folder)
    return ExportedModel.from_pretrained(folder)


# nncf-int4: NNCF's int8 backup for the embedding and the lm_head gives both the same codes, so they are shared;
# nncf-int8: SmoothQuant rescales the lm_head's weight, so its codes differ and the table keeps its own copy (the
# lookup is still rewritten). ONNX Runtime's own Gather quantization already dequantizes after the lookup.
@pytest.mark.parametrize("name,shared", [("nncf-int4", True),
                                         pytest.param("nncf-int8", False, marks=pytest.mark.sweep)])  # (24 s)
def test_lookup_dequantizes_its_rows_only_and_shares_a_tied_lm_heads_identical_int8_copy(
    tied, name, shared, tmp_path, monkeypatch
):
    import onnx

    model, inputs = tied
    rewritten = _export(model, inputs, name, tmp_path / "rewritten")
    monkeypatch.setattr(onnx_gather, "gather_before_dequantize", lambda m: 0)
    reference = _export(model, inputs, name, tmp_path / "reference")

    graph = onnx.load(str(tmp_path / "rewritten" / "model.onnx")).graph
    producers = {out: node for node in graph.node for out in node.output}
    lookups = [n for n in graph.node if n.op_type == "Gather" and n.input[0] in producers]
    assert not [n for n in lookups if producers[n.input[0]].op_type == "DequantizeLinear"]
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    tables = [i for i in graph.initializer if sorted(i.dims) == sorted([vocab, hidden])]
    assert len(tables) == (1 if shared else 2), [(t.name, t.dims, t.data_type) for t in tables]
    assert all(t.data_type in (onnx.TensorProto.INT8, onnx.TensorProto.UINT8) for t in tables)
    saved = weight_bytes(tmp_path / "reference") - weight_bytes(tmp_path / "rewritten")
    if shared:
        assert saved >= vocab * hidden - 64  # one int8 copy of the table less (a few bytes of new constants)
    else:
        assert abs(saved) <= 64

    got = rewritten(**inputs).logits
    want = reference(**inputs).logits
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=0, atol=1e-5)
