"""Prompt-lookup decoding on SmolLM2-135M: tokens and speed against plain greedy decode, on the same export.

``python benchmarks/prompt_lookup.py [--backend onnx] [--new 96] [--rounds 3]`` exports SmolLM2 (static cache 512,
multi-token decode), then on a prompt that asks the model to rewrite a paragraph it was given (so its answer repeats
its context, where prompt lookup drafts well) times, in interleaved rounds: eager greedy, eager prompt lookup, the
export's greedy and the export's prompt lookup (``prompt_lookup_num_tokens=10``). Prints tok/s (best round), the
speed-up of prompt lookup on the export, the graph calls per generated token, and whether each pair of token
sequences is equal. The load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import copy
import os
import time

import torch

PARAGRAPH = ("The old lighthouse stood on the rocks at the end of the harbour. Every night the keeper climbed the "
             "narrow stairs, lit the great lamp and watched the ships pass safely into the bay. When the storm came, "
             "the light kept burning, and every ship came home.")
PROMPT = f"Rewrite this paragraph, word for word:\n\n{PARAGRAPH}\n\nRewritten paragraph:\n\n{PARAGRAPH[:60]}"


def _export(model, tokenizer, backend):
    gen = copy.deepcopy(model.generation_config)
    gen.cache_implementation, gen.max_cache_len, gen.do_sample = "static", 512, False
    sample = dict(tokenizer(["Hello, world!"], return_tensors="pt"))
    if backend == "onnx":
        from hfexport.exporter_onnx import OnnxConfig, OnnxExporter
        exporter, config = OnnxExporter(), OnnxConfig(dynamic=True, ort_fusions="cpu")
    else:
        from hfexport.exporter_dynamo import DynamoConfig, DynamoExporter
        exporter, config = DynamoExporter(), DynamoConfig(dynamic=True)
    return exporter.export_for_generation(model, sample, config, generation_config=gen, multi_token_decode=True)


def _timed(fn, inputs, new, **kwargs):
    start = time.perf_counter()
    with torch.no_grad():
        out = fn(**inputs, max_new_tokens=new, min_new_tokens=new, do_sample=False, **kwargs)
    seconds = time.perf_counter() - start
    return out, (out.shape[-1] - inputs["input_ids"].shape[-1]) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", default="dynamo", choices=("dynamo", "onnx"))
    parser.add_argument("--new", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--draft", type=int, default=10)
    args = parser.parse_args()
    from hfexport.testing.packaged import packaged

    print(f"load average at start: {os.getloadavg()}")
    model, tokenizer = packaged("smollm2")
    start = time.perf_counter()
    exported = _export(model, tokenizer, args.backend)
    print(f"export ({args.backend}, static 512, multi-token decode): {time.perf_counter() - start:.0f} s")
    inputs = dict(tokenizer(PROMPT, return_tensors="pt"))
    lookup = {"prompt_lookup_num_tokens": args.draft}
    runs = {"eager greedy": (model.generate, {}), "eager prompt lookup": (model.generate, lookup),
            "export greedy": (exported.generate, {}), "export prompt lookup": (exported.generate, lookup)}
    for fn, kwargs in runs.values():  # warm-up
        _timed(fn, inputs, 8, **kwargs)
    best = {name: 0.0 for name in runs}
    tokens = {}
    calls = []
    runner = exported.runner("decode")
    select = runner.select_inputs
    runner.select_inputs = lambda kwargs: calls.append(1) or select(kwargs)
    for _ in range(args.rounds):
        for name, (fn, kwargs) in runs.items():
            calls.clear()
            out, speed = _timed(fn, inputs, args.new, **kwargs)
            best[name] = max(best[name], speed)
            tokens[name] = out
            if name.startswith("export"):
                tokens[name + " calls"] = len(calls)
    for name in runs:
        extra = f", {tokens[name + ' calls']} graph calls" if name.startswith("export") else ""
        print(f"{name:22s} {best[name]:7.1f} tok/s{extra}")
    print(f"prompt lookup speed-up on the export: {best['export prompt lookup'] / best['export greedy']:.2f}x; "
          f"vs eager greedy: {best['export prompt lookup'] / best['eager greedy']:.2f}x")
    for a, b in (("eager greedy", "eager prompt lookup"), ("eager prompt lookup", "export prompt lookup"),
                 ("export greedy", "export prompt lookup")):
        print(f"tokens equal, {a} / {b}: {torch.equal(tokens[a], tokens[b])}")
    print(tokenizer.decode(tokens["export prompt lookup"][0, inputs["input_ids"].shape[-1]:]))
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
