"""Decode speed of two hfexport trees side by side, in one run: a refactor must not slow generation down.

``python benchmarks/ab_decode.py --before REV`` checks ``REV`` out into a temporary git worktree and, for each
backend's recommended recipe (the first row of benchmarks/RESULTS.md), exports SmolLM2-135M once with each tree's
own code (each in a child process whose ``sys.path`` holds only that tree's ``src``), then times greedy decode of the
saved exports in interleaved rounds (before, after, before, after, ...), each round in a fresh child that loads the
export, warms it up and times ``generate``. Prints tok/s per backend and tree (all rounds), the after/before ratio
of the best and of the median round, and whether both trees produced the same tokens. ``--top-k K`` times top-k
sampling (seeded) instead of greedy decode. Each child times ``--repeats`` generations after its warm-up and keeps
the best (a round's figure is the machine's best in that round, not one sample of its noise). ``--model tiny`` runs a
tiny random Llama (2 layers, hidden 64, SmolLM2's vocabulary) instead: its step is almost all the loop's and the
runner's own Python, so it prints the per-step overhead (µs per new token) of each tree. ``--same-export`` exports
once with the after tree and has both trees decode that one export: what is left is the generation loop and the
runner, not a graph change made between the two trees (a later accuracy fix that adds an op, say). Each row also
prints the median of the paired ratios (round i's after over round i's before, taken back to back), which is less
moved by the machine drifting during the run than a ratio of two separate medians. The machine's load average is
printed at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROMPT = "Once upon a time, in a small village at the edge of a great forest, there lived"
BACKENDS = ("dynamo", "onnx", "openvino", "executorch")

# the child: run with one tree's src first on sys.path; prints one JSON line
CHILD = r'''
import json, sys, time, copy
import torch
mode, backend, out, new_tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
extra = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}  # generation arguments (top-k sampling)
which, repeats = (sys.argv[6], int(sys.argv[7])) if len(sys.argv) > 7 else ("smollm2", 1)
import hfexport
prompt = "%s"
if which == "tiny":  # built here, not from a tree's testing package: the same model in both trees
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         bos_token_id=1, eos_token_id=2, pad_token_id=2)).eval()
    def tokenizer(text, return_tensors="pt"):
        return {"input_ids": torch.arange(10, 10 + len(prompt.split()))[None]}
else:
    try:
        from hfexport.testing.packaged import packaged
    except ImportError:  # the tree before the testing/ package
        from hfexport.models.packaged import packaged
    model, tokenizer = packaged("smollm2")
if mode == "export":
    gen = copy.deepcopy(model.generation_config)
    gen.cache_implementation, gen.max_cache_len, gen.do_sample = "static", 256, False
    sample = dict(tokenizer(["Hello, world!"], return_tensors="pt"))
    if backend == "dynamo":
        from hfexport.exporter_dynamo import DynamoExporter as E, DynamoConfig as C
        config = C(dynamic=True)
    elif backend == "onnx":
        from hfexport.exporter_onnx import OnnxExporter as E, OnnxConfig as C
        config = C(dynamic=True, ort_fusions="cpu")
    elif backend == "openvino":
        from hfexport.exporter_openvino import OpenVINOExporter as E, OpenVINOConfig as C
        config = C(dynamic=True)
    else:
        from hfexport.exporter_executorch import ExecutorchExporter as E, ExecutorchConfig as C
        config = C(dynamic=True)
    start = time.perf_counter()
    exported = E().export_for_generation(model, sample, config, generation_config=gen, multi_token_decode=True)
    exported.save_pretrained(out)
    print(json.dumps({"export_s": time.perf_counter() - start, "src": hfexport.__file__}))
else:
    exported = hfexport.ExportedModel.from_pretrained(out)
    inputs = dict(tokenizer(prompt, return_tensors="pt"))
    exported.generate(**inputs, max_new_tokens=8, **extra)  # warm-up
    best = None
    for _ in range(repeats):
        torch.manual_seed(0)
        start = time.perf_counter()
        tokens = exported.generate(**inputs, max_new_tokens=new_tokens, **extra)
        seconds = time.perf_counter() - start
        best = seconds if best is None else min(best, seconds)
    new = tokens.shape[-1] - inputs["input_ids"].shape[-1]
    print(json.dumps({"tok_s": new / best, "new": int(new), "tokens": tokens[0].tolist(), "src": hfexport.__file__}))
''' % PROMPT


def _child(src: Path, *args: str, timeout: int = 1800) -> dict:
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONNOUSERSITE": "1"}
    # an editable install of the current tree would come first on sys.path: -c runs with PYTHONPATH ahead of it, and
    # the child checks hfexport.__file__ (printed) to be sure which tree ran
    result = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True, text=True,
                            timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{result.stderr[-3000:]}")
    record = json.loads(result.stdout.strip().splitlines()[-1])
    if not record["src"].startswith(str(src)):
        raise RuntimeError(f"the child ran {record['src']}, not the tree under {src}")
    return record


def _summarize(name: str, row: dict, trees: dict, per_step: bool) -> None:
    best = {tree: max(row[tree]["tok_s"]) for tree in trees}
    median = {tree: statistics.median(row[tree]["tok_s"]) for tree in trees}
    row["ratio"] = best["after"] / best["before"]
    row["median_ratio"] = median["after"] / median["before"]
    row["paired_median_ratio"] = statistics.median(a / b for a, b in zip(row["after"]["tok_s"], row["before"]["tok_s"]))
    row["same_tokens"] = row["before"]["tokens"] == row["after"]["tokens"]
    print(f"[ab] {name}: before {best['before']:.1f} tok/s "
          f"({', '.join(f'{v:.1f}' for v in row['before']['tok_s'])}), after {best['after']:.1f} tok/s "
          f"({', '.join(f'{v:.1f}' for v in row['after']['tok_s'])}), after/before {row['ratio']:.3f} (best), "
          f"{row['median_ratio']:.3f} (median), {row['paired_median_ratio']:.3f} (paired median), same tokens: {row['same_tokens']}", flush=True)
    if per_step:
        print(f"[ab] {name}: per step (best round) before {1e6 / best['before']:.0f} us, after "
              f"{1e6 / best['after']:.0f} us", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the 'before' tree")
    parser.add_argument("--backends", type=lambda v: tuple(v.split(",")), default=BACKENDS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    parser.add_argument("--repeats", type=int, default=3, help="timed generations per child (the best is kept)")
    parser.add_argument("--top-k", type=int, default=None,
                        help="time top-k sampling (do_sample=True, top_k=K, torch seed 0) too, over the same exports")
    parser.add_argument("--same-export", action="store_true",
                        help="export once with the after tree; both trees decode that export")
    args = parser.parse_args(argv)
    modes = {"greedy": json.dumps({"do_sample": False})}
    if args.top_k:
        modes[f"top-k {args.top_k}"] = json.dumps({"do_sample": True, "top_k": args.top_k})
    print(f"[ab] load average at start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="hfexport-ab-") as tmp:
        work = Path(tmp)
        before = work / "before"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(before), args.before],
                       check=True)
        trees = {"before": before / "src", "after": REPO / "src"}
        results: dict[str, dict] = {}
        try:
            for backend in args.backends:
                exports, folders = {}, {}
                for tree, src in trees.items():
                    folders[tree] = work / f"{backend}-{'after' if args.same_export else tree}"
                    if args.same_export and tree == "before":
                        continue
                    exports[tree] = _child(src, "export", backend, str(folders[tree]), "0", "{}", args.model,
                                           "1")["export_s"]
                    print(f"[ab] {backend} {tree}: exported in {exports[tree]:.1f}s", flush=True)
                if args.same_export:
                    exports["before"] = exports["after"]
                rows = {mode: {tree: {"export_s": exports[tree], "tok_s": [], "tokens": None} for tree in trees}
                        for mode in modes}
                for _ in range(args.rounds):
                    for mode, extra in modes.items():
                        for tree, src in trees.items():
                            record = _child(src, "decode", backend, str(folders[tree]),
                                            str(args.new_tokens), extra, args.model, str(args.repeats))
                            rows[mode][tree]["tok_s"].append(record["tok_s"])
                            rows[mode][tree]["tokens"] = record["tokens"]
                for mode, row in rows.items():
                    results[f"{backend} {mode}"] = row
                    _summarize(f"{backend} {mode}", row, trees, args.model == "tiny")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=False)
    print(f"[ab] load average at end: {os.getloadavg()}", flush=True)
    if args.json:
        for row in results.values():
            for tree in ("before", "after"):
                row[tree].pop("tokens", None)
        args.json.write_text(json.dumps({"before": args.before, "model": args.model, "repeats": args.repeats,
                                         "same_export": args.same_export,
                                         "time": time.strftime("%Y-%m-%d %H:%M UTC",
                                         time.gmtime()), "results": results}, indent=2) + "\n")
    return 0 if all(r["same_tokens"] for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
