"""``logits_to_keep_input=True``: a multi-token decode graph takes the query positions its LM head projects as an
input, and a prompt served by it projects its last position only, as eager ``generate()`` does with
``logits_to_keep=1``.

transformers' forwards take ``logits_to_keep`` as an int (the last N positions) or a 1-D tensor of positions
(``slice_logits_to_keep``). The decode graph is traced with the tensor form, every query position of the sample:
the runner passes every position when a call names none (the forward's default, 0: a caller verifying drafts reads
them all), and the generation loop passes the prompt's last one when the graph serves the prefill, so the head's
FLOPs are not spent on the prompt's other positions. Without the option the graph's inputs stay the ones the
guide's own runtime loops feed (its ONNX Runtime and ExecuTorch C++ loops).
"""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from hfexport import DynamoConfig, OnnxConfig
from hfexport.exporter_dynamo import DynamoExporter
from hfexport.testing.tiny import TINY_CASES
from hfexport.utils import decompose_for_generation

GEN = GenerationConfig(cache_implementation="static", max_cache_len=48, max_new_tokens=10, min_new_tokens=10,
                       do_sample=False)


def _exporter(backend):
    if backend == "onnx":
        pytest.importorskip("onnxruntime", reason="the ONNX backend needs onnxruntime")
        from hfexport.exporter_onnx import OnnxExporter
        return OnnxExporter(), OnnxConfig(dynamic=True)
    return DynamoExporter(), DynamoConfig(dynamic=True)


class _Recording:
    """A runner that records the query length of each call and the positions its logits hold."""

    def __init__(self, runner, calls):
        self._runner, self._calls = runner, calls

    def __call__(self, **kwargs):
        out = self._runner(**kwargs)
        self._calls.append((kwargs["input_ids"].shape[1], out.logits.shape[1]))
        return out

    def __getattr__(self, name):
        return getattr(self._runner, name)


@pytest.mark.parametrize("backend", ["dynamo", "onnx"])
def test_the_decode_graph_projects_the_positions_it_is_given_and_a_prompt_its_last(backend):
    case = TINY_CASES["llama"]
    model = case.build()
    inputs = {k: v for k, v in case.inputs(2, 7).items() if not k.startswith("decoder")}
    components = decompose_for_generation(model, dict(inputs), generation_config=GEN, multi_token_decode=True,
                                          logits_to_keep_input=True)
    submodel, kwargs = components["decode"]
    assert kwargs["logits_to_keep"].tolist() == [0, 1]  # traced with every query position of the merged decode
    with torch.no_grad():
        every = submodel(**{k: v for k, v in kwargs.items() if k != "logits_to_keep"}).logits
        second = submodel(**{**kwargs, "logits_to_keep": torch.tensor([1])}).logits
    # premise: the index changes eager's result (one position instead of two), and keeps that position's logits
    assert every.shape[1] == 2 and second.shape[1] == 1 and torch.allclose(second[:, 0], every[:, 1], atol=1e-6)

    exporter, config = _exporter(backend)
    exported = exporter.export_for_generation(model, dict(inputs), config, generation_config=GEN,
                                              multi_token_decode=True, logits_to_keep_input=True)
    runner = exported.runner("decode")
    got_every = runner(**{k: v for k, v in kwargs.items() if k != "logits_to_keep"}).logits
    got_second = runner(**{**kwargs, "logits_to_keep": torch.tensor([1])}).logits
    assert got_every.shape == every.shape and (got_every - every).abs().max() <= 1e-4
    assert got_second.shape == second.shape and (got_second - second).abs().max() <= 1e-4

    calls = []
    served = exported.runner
    exported.runner = lambda name: _Recording(served(name), calls)
    with torch.no_grad():
        want = model.generate(**inputs, generation_config=GEN)
    got = exported.generate(**inputs, generation_config=GEN)
    assert torch.equal(got, want)
    # the 7-token prompt through the decode graph: its last position only; then one position a token
    assert calls[0] == (7, 1) and all(call == (1, 1) for call in calls[1:]) and len(calls) == 10


def test_without_the_option_the_decode_graph_takes_what_the_guides_loops_feed():
    case = TINY_CASES["llama"]
    model = case.build()
    inputs = {k: v for k, v in case.inputs(2, 7).items() if not k.startswith("decoder")}
    plain = decompose_for_generation(model, dict(inputs), generation_config=GEN, multi_token_decode=True)
    kept = decompose_for_generation(model, dict(inputs), generation_config=GEN, multi_token_decode=True,
                                    logits_to_keep_input=True)
    assert "logits_to_keep" not in plain["decode"][1] and set(kept["decode"][1]) - set(plain["decode"][1]) == {
        "logits_to_keep"}
    # a single-token decode has one position to project: nothing to take
    single = decompose_for_generation(model, dict(inputs), generation_config=GEN, logits_to_keep_input=True)
    assert "logits_to_keep" not in single["decode"][1]


def test_a_quantizer_calibrates_the_prompt_on_its_last_position_as_generate_feeds_it():
    from hfexport.quantizers.calibration import capture_calibration

    case = TINY_CASES["llama"]
    model = case.build()
    captured = capture_calibration(model, [case.inputs(1, 9, padded=False)], GEN, multi_token_decode=True,
                                   logits_to_keep_input=True)
    step, prompt = captured["decode"]
    assert step["input_ids"].shape == (1, 2) and step["logits_to_keep"].tolist() == [0, 1]
    assert prompt["input_ids"].shape == (1, 9) and prompt["logits_to_keep"].tolist() == [8]


def _tied_llama(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    return LlamaForCausalLM(config).eval()


def test_onnx_gathers_the_kept_positions_on_their_axis_which_the_fused_runtime_runs(without_workaround):
    """``onnx-index-one-axis``: with ``ort_fusions``, a tied head too large for the export's constant folding (SmolLM2's;
    here 20000 x 64) keeps its weight's Transpose, and ONNX Runtime's MatMul/Transpose fusion merges it and the
    transposes torchlib writes around an inner-axis index into a FusedMatMul its kernel refuses."""
    pytest.importorskip("onnxruntime", reason="the ONNX backend needs onnxruntime")
    from hfexport.exporter_onnx import OnnxExporter

    model = _tied_llama(20000)
    ids = torch.randint(3, 19000, (1, 9), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    gen = GenerationConfig(cache_implementation="static", max_cache_len=32, max_new_tokens=6, min_new_tokens=6,
                           do_sample=False)
    with torch.no_grad():
        want = model.generate(**inputs, generation_config=gen)

    def export():
        return OnnxExporter().export_for_generation(model, dict(inputs), OnnxConfig(dynamic=True, ort_fusions="cpu"),
                                                    generation_config=gen, multi_token_decode=True,
                                                    logits_to_keep_input=True)

    exported = export()
    assert torch.equal(exported.generate(**inputs, generation_config=gen), want)
    graph = exported.components["decode"].program.graph
    (gather,) = [n for n in graph if "logits_to_keep" in [v.name for v in n.inputs if v is not None]]
    assert gather.op_type == "Gather" and gather.attributes["axis"].value == 1
    without_workaround("onnx-index-one-axis")
    unrewritten = export()
    with pytest.raises(Exception, match="FusedMatMul"):  # premise: torchlib's transposes, then the fusion
        unrewritten.generate(**inputs, generation_config=gen)
