"""ExportedModel.generate on AOTInductor exports gives exactly the tokens of eager model.generate.

Every text family x {dynamic cache + single-token decode, static cache + multi-token decode}; a left-padded batch of
2 whose prompt length differs from the capture's; 32 new tokens (Gemma3's window is 8, so it decodes past it several
times). Each export compiles one or two (three for encoder-decoders) C++ libraries (~10-40 s each on 2 cores): the
table runs in the sweep (``make test-sweep``); the default suite keeps tests/test_aoti_backend.py (Llama, both caches).
Gemma3's sliding window went to the sweep too (45 s, for the default suite's 25 minutes): AOTInductor compiles the
graph torch.export traced, and that graph's window decoded past is in the default suite on Dynamo
(tests/models/test_generate_dynamo.py, gemma3-dynamic-single) and ONNX.
"""

from __future__ import annotations


import pytest
from generation_cases import assert_greedy_equals_eager, generation_config, text_inputs

from hfexport import AotiConfig, UnsupportedError
from hfexport.exporter_aoti import AotiExporter
from hfexport.testing.tiny import TINY_CASES

NEW_TOKENS = 32
FAMILIES = ["llama", "qwen3", "gpt2", "gemma3", "mixtral", "qwen3_moe", "t5", "whisper", "mamba"]
COMBOS = [("dynamic", False), ("static", True)]
# quick compiles (gemm="aten", ~12 s a library; the default gemm="cpp" autotunes every GEMM shape, ~50 s, and runs in
# tests/test_aoti_backend.py and the rest of the table): a sliding window decoded past, in one package
ATEN = {("gemma3", "static", True)}

# (family, cache, multi) -> why it cannot work, naming the upstream limitation
UNSUPPORTED = {
    ("mamba", "static", True): "transformers MambaMixer.forward (modeling_mamba.py) runs the recurrent update only "
    "for seq_len == 1 and restarts the scan from a zero state for longer inputs, so a merged decode cannot continue",
}


def _params():
    for family in FAMILIES:
        for cache, multi in COMBOS:
            yield pytest.param(family, cache, multi, marks=pytest.mark.sweep,
                               id=f"{family}-{cache}-{'multi' if multi else 'single'}")


@pytest.mark.parametrize("family,cache,multi", list(_params()))
def test_greedy_tokens_equal_eager(family, cache, multi):
    config = AotiConfig(dynamic=True, gemm="aten" if (family, cache, multi) in ATEN else "cpp")
    case = TINY_CASES[family]
    model = case.build()
    gen = generation_config(model, cache)
    static_cross = cache == "static" and model.config.is_encoder_decoder
    sample = text_inputs(case, 2, 12 if static_cross else 6)
    reason = UNSUPPORTED.get((family, cache, multi))
    if reason:
        with pytest.raises(UnsupportedError, match="multi_token_decode"):
            AotiExporter().export_for_generation(model, sample, config, generation_config=gen,
                                                 multi_token_decode=multi)
        pytest.skip(reason)
    exported = AotiExporter().export_for_generation(
        model, sample, config, generation_config=gen, multi_token_decode=multi
    )
    assert_greedy_equals_eager(model, exported, case, gen, NEW_TOKENS)
