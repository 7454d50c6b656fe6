"""ExportedModel.generate on the ExecuTorch runtime (fp32, XNNPACK) gives exactly the tokens of eager generate.

The families of tests/models/test_generate_onnx.py, with a left-padded batch of 2 whose prompt length differs from
the capture's and 32 new tokens. The default suite runs Llama with a static cache and multi-token decode (one
``.pte`` serving the prompt too) and Whisper with a dynamic cache (encoder, prefill and decode: the encoder-decoder
path); the rest is in the sweep (``make test-sweep``): each family with a static cache and multi-token decode, a
dynamic cache with single-token decode for one family of each kind, and the image-text-to-text models.
"""

from __future__ import annotations


import pytest
import torch

from generation_cases import assert_greedy_equals_eager, generation_config, text_inputs
from hfexport import ExecutorchConfig, ExportedModel, UnsupportedError
from hfexport.exporter_executorch import ExecutorchExporter
from hfexport.testing.tiny import TINY_CASES

pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")

NEW_TOKENS = 32
FAMILIES = ["llama", "qwen3", "gpt2", "gemma3", "mixtral", "qwen3_moe", "t5", "whisper", "mamba"]
DEFAULT = [("llama", "static", True), ("whisper", "dynamic", False)]
SWEEP = [c for c in [(f, "static", True) for f in FAMILIES] + [
    (f, "dynamic", False) for f in ("llama", "gemma3", "mixtral", "t5", "whisper", "mamba")] if c not in DEFAULT]
# (family, multi_token_decode) -> why it cannot work, naming the upstream limitation
UNSUPPORTED_MULTI = {
    ("mamba", True): "transformers MambaMixer.forward (modeling_mamba.py) runs the recurrent update only for "
    "seq_len == 1 and restarts the scan from a zero state for longer inputs, so a merged decode cannot continue",
    **dict.fromkeys([("mixtral", True), ("qwen3_moe", True)],
                    "ExecuTorch to_edge's operator-argument check (executorch/exir/verification/arg_validator.py, "
                    "executorch 1.5.1) re-runs the MoE routing on fake tensors and adds the guard 4*q == 8, fixing "
                    "the multi-token decode graph's query axis at the sample's 2 tokens"),
}
# (family, cache, multi) -> why the ExecuTorch export cannot run it, naming the upstream limitation
UNSUPPORTED = {
    ("gpt2", "static", True): "ExecuTorch to_edge re-runs GPT-2's Conv1D aten.view(-1, hidden) on the attention "
    "output, to which the SDPA decomposition gives transposed strides: 'Cannot view a tensor with shape ...' "
    "(see tests/models/test_executorch_parity.py)",
}

# (family, cache, multi) -> what fails, measured in the sweep; strict, so a fix upstream shows up as XPASS.
# (Mamba's dynamic-cache decode was here: an aten.empty with a symbolic size pinned its dims, fixed by the
# workaround executorch-symbolic-empty)
KNOWN_FAILURES: dict = {}


def _marks(case):
    marks = [pytest.mark.sweep] if case not in DEFAULT else []
    if case in KNOWN_FAILURES:
        marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILURES[case]))
    return marks


CASES = [pytest.param(*c, id=f"{c[0]}-{c[1]}-{'multi' if c[2] else 'single'}", marks=_marks(c))
         for c in DEFAULT + SWEEP]


@pytest.mark.parametrize("family,cache,multi", CASES)
def test_greedy_tokens_equal_eager(family, cache, multi, tmp_path):
    if (family, cache, multi) in UNSUPPORTED:
        pytest.skip(UNSUPPORTED[(family, cache, multi)])
    case = TINY_CASES[family]
    model = case.build()
    gen = generation_config(model, cache)
    static_cross = cache == "static" and model.config.is_encoder_decoder
    sample = text_inputs(case, 2, 12 if static_cross else 6)
    config = ExecutorchConfig(dynamic=True)
    reason = UNSUPPORTED_MULTI.get((family, multi))
    if reason:
        with pytest.raises(UnsupportedError, match="multi_token_decode"):
            ExecutorchExporter().export_for_generation(model, sample, config, generation_config=gen,
                                                       multi_token_decode=multi)
        pytest.skip(reason)
    exported = ExecutorchExporter().export_for_generation(model, sample, config, generation_config=gen,
                                                          multi_token_decode=multi)
    served = exported.components["prefill"] is exported.components["decode"]
    cache_info = exported.components["decode"].metadata.kwargs.get("past_key_values", {})
    assert "state_layout" not in cache_info, "a left-padded batch of 2 keeps the SDPA path (no llama custom ops)"
    assert served == (cache == "static" and multi and not model.config.is_encoder_decoder)
    prompt, expected = assert_greedy_equals_eager(model, exported, case, gen, NEW_TOKENS)
    if served:  # one .pte for prefill and decode: the weights are stored once
        exported.save_pretrained(tmp_path)
        assert sorted(p.name for p in tmp_path.glob("*.pte")) == ["decode.pte"]
        reloaded = ExportedModel.from_pretrained(tmp_path)
        again = reloaded.generate(**prompt, max_new_tokens=NEW_TOKENS)
        assert torch.equal(again, expected)


@pytest.mark.sweep
@pytest.mark.parametrize("name", ["qwen2_vl", "llava"])  # (Qwen2-VL: error 0x12 on its tower before its precomputed
# grid inputs became derived inputs and its Conv3d patches a linear, issue 22)
def test_image_text_to_text_generates_like_eager(name):
    case = TINY_CASES[name]
    model = case.build()
    exported = ExecutorchExporter().export_for_generation(model, case.inputs(2, 6), ExecutorchConfig(dynamic=True))
    inputs = case.inputs(2, 9)
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    got = exported.generate(**inputs, max_new_tokens=NEW_TOKENS)
    assert got.shape == expected.shape and torch.equal(got, expected), (got, expected)


@pytest.mark.sweep  # (2.5 min: a whole MiniCPM3 generation export on ExecuTorch; `make test-sweep` runs it)
def test_a_symbolic_empty_keeps_the_programs_dynamic_sizes():
    # MiniCPM3's latent attention traces an aten.empty([batch, past + 1]); ExecuTorch's MemoryFormatOpsPass made it
    # _empty_dim_order(int[] size), guarding batch and length to the capture's values program-wide, so a 9-token
    # prompt was refused ("set_inputs ... error 0x10") where eager generates (workaround executorch-symbolic-empty)
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    model = build_model("minicpm3", "MiniCPM3ForCausalLM")
    gen = generation_config(model, "dynamic")
    sample = sample_inputs(model, "minicpm3", batch=2, seq=6, for_generation=True)
    exported = ExecutorchExporter().export_for_generation(model, sample, ExecutorchConfig(dynamic=True),
                                                          generation_config=gen)
    assert "executorch-symbolic-empty" in exported.components["decode"].metadata.workarounds
    keys = [i for i, s in enumerate(exported.components["decode"].metadata.inputs) if s.name.endswith(".keys")]
    planned = exported.runner("decode").planned_sizes()[keys[0]]
    assert planned[2] > 6, planned  # the cache's length axis planned past the capture's
    prompt = sample_inputs(model, "minicpm3", batch=2, seq=9, for_generation=True)
    with torch.no_grad():
        expected = model.generate(**prompt, generation_config=gen, max_new_tokens=12, min_new_tokens=12)
    got = exported.generate(**prompt, max_new_tokens=12, min_new_tokens=12)
    assert torch.equal(got, expected), (got, expected)
