"""Probe (issue 21): the growing-cache OpenVINO IR's 512-token prefill with the in-graph causal mask vs ``causal=True``.

The recommended OpenVINO recipe (stateful, growing cache, one multi-token IR) decodes 1.4x faster than the static
cache's IR, but its 512-token prefill is slower (1.85 s against 1.0 s, eager 0.9 s, on 2026-12-03): the CPU plugin's
fused stateful attention (``ScaledDotProductAttentionWithKVCache``) spends 1.7 s of it with the explicit boolean
causal mask transformers builds in the graph. This script exports SmolLM2 with that recipe, writes a copy whose
``ScaledDotProductAttention`` ops take ``causal=True`` and no mask, profiles one 512-token prefill of each
(``PERF_COUNT``) and checks both copies' greedy tokens (prompt + 32 steps) against eager's. Measured 2026-12-03
(a helper session running beside it): attention 1724 -> 443 ms, the whole prefill 3.69 -> 2.43 s profiled, tokens equal on two
prompts. Only a pure causal mask may be replaced (no padding, no sliding window: Gemma's window is an extra ``And``),
and only where the plugin fuses the attention with its state (that kernel aligns ``causal`` to the end of the keys):
the runner now does this at compile time, with the proof, in ``hfexport.backends.openvino.causal``.

    python benchmarks/openvino_causal_prefill_probe.py
"""

from __future__ import annotations

import collections
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch


def causal_copy(src: Path, dst: Path) -> int:
    import openvino as ov
    import openvino.opset13 as ops

    model = ov.Core().read_model(str(src / "openvino_model.xml"))
    count = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "ScaledDotProductAttention":
            continue
        q, k, v = (node.input_value(i) for i in range(3))
        if node.get_input_size() > 4:  # opset13 takes a scale only after a mask: a zero additive mask
            zero = ops.constant(np.array(0.0, dtype=np.float32))
            new = ops.scaled_dot_product_attention(q, k, v, zero, node.input_value(4), causal=True)
        else:
            new = ops.scaled_dot_product_attention(q, k, v, causal=True)
        for target in list(node.output(0).get_target_inputs()):
            target.replace_source_output(new.output(0))
        count += 1
    model.validate_nodes_and_infer_types()
    dst.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(dst / "openvino_model.xml"), compress_to_fp16=False)
    return count


def compiled(folder: Path, perf: bool = False):
    import openvino as ov

    props = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    if perf:
        props["PERF_COUNT"] = "YES"
    return ov.Core().compile_model(str(folder / "openvino_model.xml"), "CPU", props)


def feed(ids: np.ndarray, start: int) -> dict:
    return {"input_ids": ids, "position_ids": np.arange(start, start + ids.shape[1])[None].astype(np.int64),
            "beam_idx": np.zeros(1, np.int32)}


def prefill_profile(folder: Path, tokens: int = 512) -> dict[str, float]:
    request = compiled(folder, perf=True).create_infer_request()
    for _ in range(2):
        request.reset_state()
        request.infer(feed(np.full((1, tokens), 42, dtype=np.int64), 0))
    by_type: collections.Counter = collections.Counter()
    for info in request.profiling_info:
        by_type[info.node_type] += info.real_time.total_seconds() * 1e3
    return {"total_ms": sum(by_type.values()), **{k: v for k, v in by_type.most_common(3)}}


def greedy(folder: Path, ids: torch.Tensor, steps: int) -> list[int]:
    request = compiled(folder).create_infer_request()
    request.reset_state()
    q, position, out = ids.numpy(), 0, []
    for _ in range(steps):
        logits = list(request.infer(feed(q, position)).values())[0]
        position += q.shape[1]
        out.append(int(logits[0, -1].argmax()))
        q = np.array([[out[-1]]], dtype=np.int64)
    return out


def main() -> int:
    from hfexport import OpenVINOConfig
    from hfexport.exporter_openvino import OpenVINOExporter
    from hfexport.testing.packaged import packaged

    model, tokenizer = packaged("smollm2")
    with tempfile.TemporaryDirectory() as tmp:
        plain, causal = Path(tmp) / "mask", Path(tmp) / "causal"
        sample = dict(tokenizer(["Hello, world!"], return_tensors="pt"))
        OpenVINOExporter().export_for_generation(
            model, sample, OpenVINOConfig(dynamic=True, stateful=True), multi_token_decode=True
        ).save_pretrained(plain)
        print("attention ops rewritten:", causal_copy(plain, causal))
        for name, folder in (("explicit mask", plain), ("causal=True", causal)):
            print(name, {k: round(v, 1) for k, v in prefill_profile(folder).items()})
        for text in ("The quick brown fox jumps over the lazy dog because it wanted to see", "def fib(n):"):
            ids = tokenizer([text], return_tensors="pt")["input_ids"]
            want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                                  do_sample=False)[0, ids.shape[1]:].tolist()
            print(repr(text[:20]), {name: greedy(folder, ids, 32) == want for name, folder in
                                     (("explicit mask", plain), ("causal=True", causal))})
    return 0


if __name__ == "__main__":
    sys.exit(main())
