"""Why int4 agreement on the packaged SmolLM2 says little: its float weights are a dequantized Q4_1 GGUF.

The benchmark model (``hfexport.testing.packaged.packaged("smollm2")``) is SmolLM2-135M-Instruct shipped as
``SmolLM2-135M-Instruct.Q4_1.gguf`` and dequantized at load: every linear weight already lies on a 4-bit grid, one per
block of 32 along the input axis, ``w = q * d + m`` with a float offset ``m``. An int4 recipe whose zero points are
integers (ONNX Runtime ``MatMulNBits``' fast path, NNCF ``INT4_ASYM``) or absent (symmetric: XNNPACK qb4w) re-quantizes
that grid onto another one, and loses what a first quantization of the original bf16 weights would; a recipe with float
zero points (HQQ) finds the GGUF's grid back almost exactly.

This probe measures it in eager PyTorch, with no export in the way: each scheme fake-quantizes the linear weights
(dequantized back to float32), the lm_head at int8 per block of 32 (as ``ort-int4``), and scores the greedy top-1
agreement with the fp32 model over 64 teacher-forced steps on bench_quantized's evaluation and held-out prompts (one
forward over eager's greedy sequence). The weight codes come from ONNX Runtime's own quantizer functions (k-quant, HQQ);
round-to-nearest is written here.

    python benchmarks/quant_source_grid.py     # ~1 minute on 2 cores; prints a markdown table
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quant_prompts import EVAL_PROMPTS, HELDOUT_PROMPTS  # noqa: E402

BLOCK = 32
STEPS = 64


def round_to_nearest(w: torch.Tensor, bits: int, symmetric: bool) -> torch.Tensor:
    """``w`` ([out, in]) quantized per block of 32 inputs, integer zero points, dequantized."""
    x = w.reshape(-1, BLOCK).double()
    if symmetric:
        half = 2 ** (bits - 1)
        scale = x.abs().amax(1, keepdim=True) / (half - 1 if bits == 8 else half)
        scale[scale == 0] = 1
        return ((x / scale).round().clamp(-half, half - 1) * scale).reshape(w.shape).float()
    top = 2**bits - 1
    low, high = x.amin(1, keepdim=True).clamp(max=0), x.amax(1, keepdim=True).clamp(min=0)
    scale = (high - low) / top
    scale[scale == 0] = 1
    zero = (-low / scale).round().clamp(0, top)
    return (((x / scale).round() + zero).clamp(0, top) - zero).mul(scale).reshape(w.shape).float()


def k_quant(w: torch.Tensor) -> torch.Tensor:
    """ONNX Runtime's k-quant (llama.cpp's scale search), integer zero points."""
    from onnxruntime.quantization.neural_compressor.weight_only import quant_tensor_k_quant_cpu

    codes, scale, zero = quant_tensor_k_quant_cpu(w.reshape(-1, BLOCK).double().numpy(), 4, BLOCK)
    return torch.from_numpy((codes - zero) * scale).reshape(w.shape).float()


def hqq(w: torch.Tensor, round_zero: bool = False) -> torch.Tensor:
    """ONNX Runtime's HQQ (float zero points); ``round_zero``: the zero points rounded to integers, codes redone."""
    from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig, HQQWeightOnlyQuantizer

    quantizer = HQQWeightOnlyQuantizer(HQQWeightOnlyQuantConfig(block_size=BLOCK))
    codes, scale, zero = quantizer.quantize_internal(w, bits=4, group_size=BLOCK, axis=1)
    scale, zero, codes = scale.reshape(-1, 1), zero.reshape(-1, 1), codes.reshape(-1, BLOCK).float()
    if round_zero:
        zero = zero.round().clamp(0, 15)
        codes = (w.reshape(-1, BLOCK) / scale + zero).round().clamp(0, 15)
    return ((codes - zero) * scale).reshape(w.shape)


SCHEMES = {
    "int4 round to nearest, symmetric": lambda w: round_to_nearest(w, 4, True),
    "int4 round to nearest, asymmetric (integer zero points)": lambda w: round_to_nearest(w, 4, False),
    "int4 k-quant (ONNX Runtime), integer zero points": k_quant,
    "int4 HQQ (ONNX Runtime), float zero points": hqq,
    "int4 HQQ, zero points rounded to integers": lambda w: hqq(w, round_zero=True),
    "int8 round to nearest, symmetric (ort-int8's weights)": lambda w: round_to_nearest(w, 8, True),
}


def main() -> int:
    from hfexport.testing.packaged import packaged
    from hfexport.tools.measure import eager_greedy

    model, tokenizer = packaged("smollm2")
    model.eval()
    prompts = {name: [tokenizer(p, return_tensors="pt")["input_ids"] for p in texts]
               for name, texts in (("eval", EVAL_PROMPTS), ("held-out", HELDOUT_PROMPTS))}
    sequences = {name: [eager_greedy(model, ids, STEPS) for ids in ids_list] for name, ids_list in prompts.items()}
    original = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    head = model.lm_head.weight.detach().clone()
    weight = original["model.layers.0.self_attn.q_proj.weight"]
    distinct = [len(torch.unique(block)) for block in weight.reshape(-1, BLOCK)[:1000]]
    print(f"layer 0 q_proj: {sum(distinct) / len(distinct):.1f} distinct values per block of {BLOCK} (at most 16 "
          f"on a 4-bit grid); the embedding: "
          f"{sum(len(torch.unique(b)) for b in original['model.embed_tokens.weight'].reshape(-1, BLOCK)[:1000]) / 1000:.1f}")
    print()
    print("| weights of the linear layers (lm_head int8) | relative error, layer 0 q_proj | top-1 eval | top-1 held-out |")
    print("|---|---|---|---|")
    for label, scheme in SCHEMES.items():
        model.load_state_dict(original)
        model.lm_head.weight = torch.nn.Parameter(round_to_nearest(head, 8, True))  # untied, int8
        with torch.no_grad():
            for name, module in model.named_modules():
                if isinstance(module, torch.nn.Linear) and name != "lm_head":
                    module.weight.data = scheme(module.weight.data)
            error = float((scheme(weight) - weight).norm() / weight.norm())
            scores = {}
            for name in prompts:
                hits = []
                for sequence, ids in zip(sequences[name], prompts[name]):
                    start = ids.shape[1]
                    logits = model(input_ids=sequence[:, :-1]).logits
                    hits.append(float((logits[:, start - 1 :].argmax(-1) == sequence[:, start:]).float().mean()))
                scores[name] = 100 * sum(hits) / len(hits)
        print(f"| {label} | {error:.4f} | {scores['eval']:.1f} % | {scores['held-out']:.1f} % |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
