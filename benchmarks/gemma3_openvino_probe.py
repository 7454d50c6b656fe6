"""Issue 22 probe: a random-weight Gemma3Text at real attention sizes exported to OpenVINO, logits against eager.

``python benchmarks/gemma3_openvino_probe.py`` prints the max abs logit difference for each variant (one layer,
9-token prompt, no padding, dynamic shapes unless said). Before ``hfexport.workarounds.openvino_mha_postops``
(2026-12-02, openvino 2026.3.1): head_dim 256 or 128 with SDPA 1.4-1.8 or NaN, static shapes at 520 tokens NaN;
head_dim 64 and eager attention 1e-6. The cause: the CPU plugin's Snippets MHA kernel mis-computes a broadcasting
element-wise op fused after SDPA (the fully-masked-row ``Select``) at head sizes >= 128
(``benchmarks/openvino_mha_postop_repro.py`` shows it without hfexport). With it: every variant 1.2e-6 to 2.2e-6.
The test is ``tests/models/test_openvino_real_sizes.py``.
"""

from __future__ import annotations

import torch


def probe(kind="full_attention", head_dim=256, kv=1, attn="sdpa", tokens=9, dynamic=True, layers=1, scalar=256):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from hfexport import OpenVINOConfig
    from hfexport.exporter_openvino import OpenVINOExporter

    config = Gemma3TextConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=kv, head_dim=head_dim, sliding_window=512,
                              max_position_embeddings=2048, query_pre_attn_scalar=scalar,
                              layer_types=[kind] * layers, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    torch.manual_seed(0)
    model = Gemma3ForCausalLM._from_config(config, attn_implementation=attn, dtype=torch.float32).eval()
    ids = torch.randint(3, 1000, (1, tokens), generator=torch.Generator().manual_seed(tokens))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        want = model(**inputs).logits
    got = OpenVINOExporter().export(model, inputs, OpenVINOConfig(dynamic=dynamic)).runner()(**inputs).logits
    return float((got - want).abs().max())


VARIANTS = [
    {}, {"kind": "sliding_attention"}, {"head_dim": 64}, {"attn": "eager"}, {"head_dim": 128}, {"kv": 4},
    {"scalar": 64}, {"dynamic": False}, {"tokens": 520, "dynamic": False},
]

if __name__ == "__main__":
    for variant in VARIANTS:
        print(f"{variant or 'head_dim 256, SDPA, full attention'}: max abs diff {probe(**variant):.3g}", flush=True)
