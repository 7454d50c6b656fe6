"""Models that keep no KV cache (OpenAI GPT, XLNet...) and inputs a forward takes only through ``**kwargs``.

generate() runs a cacheless model on its whole sequence at every step: export_for_generation exports that forward
once (the decode component is the prefill's program), and the export's generate() feeds it the sequence so far.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from hfexport import AutoExportConfig, AutoHfExporter, ExportedModel, UnsupportedError

NEW_TOKENS = 12


@pytest.fixture(scope="module")
def gpt():
    from transformers import OpenAIGPTConfig, OpenAIGPTLMHeadModel

    torch.manual_seed(0)
    config = OpenAIGPTConfig(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=64)
    return OpenAIGPTLMHeadModel(config).eval()


def _export(model, fmt, dynamic=True):
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": dynamic})
    sample = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoHfExporter.from_config(config).export_for_generation(
            model, {"input_ids": sample, "attention_mask": torch.ones_like(sample)}, config
        )


@pytest.mark.parametrize("fmt", ["dynamo", "onnx", "openvino", pytest.param("executorch", marks=pytest.mark.sweep)])
def test_cacheless_model_generates_eagers_tokens_from_one_program(gpt, fmt, tmp_path):
    exported = _export(gpt, fmt)
    assert exported.components["decode"].program is exported.components["prefill"].program
    exported.save_pretrained(tmp_path)
    suffix = {"dynamo": ".pt2", "onnx": ".onnx", "openvino": ".xml", "executorch": ".pte"}[fmt]
    assert len(list(tmp_path.glob(f"*{suffix}"))) == 1  # one program on disk serves both stages
    reloaded = ExportedModel.from_pretrained(tmp_path)
    for seed, (batch, seq) in enumerate([(1, 7), (2, 9)]):
        prompt = torch.randint(0, 128, (batch, seq), generator=torch.Generator().manual_seed(10 + seed))
        mask = torch.ones_like(prompt)
        with torch.no_grad():
            expected = gpt.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False)
        got = reloaded.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=NEW_TOKENS)
        assert torch.equal(got, expected), (got, expected)


def test_cacheless_model_beam_search_runs_each_beam_on_its_whole_sequence(gpt):
    """Beam search over a cacheless export: each beam's sequence (reordered as the beams swap) is fed whole at every
    step, as eager does. Fed only the new token, the tokens happened to agree here but the scores were off by 4e-3."""
    exported = _export(gpt, "dynamo")
    prompt = torch.randint(0, 128, (2, 9), generator=torch.Generator().manual_seed(11))
    call = {"attention_mask": torch.ones_like(prompt), "max_new_tokens": NEW_TOKENS, "num_beams": 3,
            "return_dict_in_generate": True, "output_scores": True}
    with torch.no_grad():
        greedy = gpt.generate(input_ids=prompt, attention_mask=call["attention_mask"], max_new_tokens=NEW_TOKENS,
                              do_sample=False)
        expected = gpt.generate(input_ids=prompt, **call)
    assert not torch.equal(expected.sequences, greedy), "beam search gives greedy's tokens"
    taken = expected.beam_indices[expected.beam_indices >= 0]
    assert (taken % 3 > 0).any(), "the beams never swap"
    got = exported.generate(input_ids=prompt, **call)
    assert torch.equal(got.sequences, expected.sequences) and torch.equal(got.beam_indices, expected.beam_indices)
    torch.testing.assert_close(got.sequences_scores, expected.sequences_scores, atol=1e-4, rtol=1e-4)


def test_cacheless_model_with_static_shapes_says_to_export_dynamic(gpt):
    with pytest.raises(UnsupportedError, match="keeps no cache.*dynamic=True"):
        _export(gpt, "dynamo", dynamic=False)


class _Wrapper(torch.nn.Module):
    """A forward that passes ``bias`` on through ``**kwargs``, as a wrapper model passes its language model's cache."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x, **kwargs):
        return self.linear(x) + kwargs["bias"]


def test_inputs_taken_through_var_keyword_export_with_dynamic_shapes():
    """torch 2.13 refuses (flat dict) or double-binds (nested dict) the dynamic_shapes of an input a forward takes
    through **kwargs; the workaround torch-export-var-keyword-inputs names it while tracing. The first assertion
    fails once torch fixes it: then drop the workaround."""
    from torch.export import Dim

    from hfexport import DynamoConfig, DynamoExporter

    model = _Wrapper().eval()
    inputs = {"x": torch.randn(2, 3, 8), "bias": torch.randn(2, 3, 8)}
    seq = Dim("seq")
    with pytest.raises(Exception, match="top-level keys must be the arg names"):
        torch.export.export(model, (), inputs, dynamic_shapes={"x": {1: seq}, "bias": {1: seq}})
    exported = DynamoExporter().export(model, dict(inputs), DynamoConfig(dynamic=True))
    assert "torch-export-var-keyword-inputs" in exported.components["model"].metadata.workarounds
    assert "forward" not in vars(model)  # undone after the trace
    other = {"x": torch.randn(2, 5, 8), "bias": torch.randn(2, 5, 8)}
    with torch.no_grad():
        torch.testing.assert_close(exported.program.module()(**other), model(**other), rtol=0, atol=1e-6)
