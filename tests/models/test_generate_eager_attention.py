"""A model exported with ``attn_implementation="eager"`` and a static cache generates eager's tokens.

Such a graph takes the prepared 4D mask as floats and adds it to the attention scores (transformers' ``eager_mask``:
0 where a query attends, the dtype's lowest value elsewhere). The generation loop builds boolean slot masks; cast
as they were to 1.0/0.0, they masked nothing: every export of an eager-attention model with a static cache was off
(max abs logit diff 0.4 on the prompt, Llama and Gemma-3 alike, on every backend). The runner now turns a boolean 4D
mask fed to a float input into the additive one. Llama, a left-padded batch of 2, 16 new tokens; Dynamo in the default suite, OpenVINO, ONNX and ExecuTorch in the sweep.
"""

from __future__ import annotations

import pytest
import torch

from generation_cases import assert_greedy_equals_eager, exporter_for, generation_config, text_inputs
from hfexport.testing.tiny import TINY_CASES

# the Dynamo runner casts its own top-level and dict inputs; OpenVINO stands for the shared flat cast (ONNX, ExecuTorch)
# (OpenVINO's 18 s in the sweep too: the default suite's test_openvino_real_sizes runs eager attention on OpenVINO)
BACKENDS = ["dynamo"] + [pytest.param(b, marks=pytest.mark.sweep) for b in ("openvino", "onnx", "executorch")]


def _llama_eager():
    case = TINY_CASES["llama"]
    model = case.build()
    model.set_attn_implementation("eager")
    return case, model


@pytest.mark.parametrize("backend", BACKENDS)
def test_static_cache_with_eager_attention_generates_like_eager(backend):
    case, model = _llama_eager()
    gen = generation_config(model, "static")
    exporter, config = exporter_for(backend)
    exported = exporter.export_for_generation(model, text_inputs(case, 2, 6), config, generation_config=gen)
    mask = next(s for s in exported.components["prefill"].metadata.inputs if s.name.startswith("attention_mask"))
    assert mask.dtype == "float32" and len(mask.shape) == 4, mask  # the case this test is about: a prepared float mask
    assert_greedy_equals_eager(model, exported, case, gen, 16)


def test_a_boolean_4d_mask_fed_to_a_float_input_is_the_additive_mask():
    from hfexport import DynamoConfig
    from hfexport.exporter_dynamo import DynamoExporter

    case, model = _llama_eager()
    inputs = text_inputs(case, 2, 6)
    keep = torch.tril(torch.ones(6, 6, dtype=torch.bool))[None, None] & inputs["attention_mask"].bool()[:, None, None]
    additive = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
    with torch.no_grad():
        want = model(input_ids=inputs["input_ids"], attention_mask=additive).logits
        as_floats = model(input_ids=inputs["input_ids"], attention_mask=keep.float()).logits
    assert float((as_floats - want).abs().max()) > 1e-2  # 1.0/0.0 is not a mask: the cast this replaces was wrong
    exported = DynamoExporter().export(model, {"input_ids": inputs["input_ids"], "attention_mask": additive},
                                       DynamoConfig(dynamic=True))
    got = exported(input_ids=inputs["input_ids"], attention_mask=keep).logits
    assert float((got - want).abs().max()) <= 1e-5
