"""Dynamo export vs eager PyTorch on SmolLM2-135M: export cost, artifact size, memory, decode speed, same tokens.

What runs where:

- Each export variant runs in its own child process (``--export-child``), so its wall time and peak RSS are its
  own: ``export_for_generation`` + ``save_pretrained``, then the folder's size on disk.
- Generation runs in this process for every variant, interleaved round by round (eager first, then each export
  loaded back with ``ExportedModel.from_pretrained``), so the tokens/s compare inside one run on one machine state.
  Every variant's greedy tokens are checked against eager's; a mismatch is printed loudly and marked in the table.
- The peer, transformers' own Dynamo exporter (``transformers.exporters``), exports the same model with the static
  recipe in a child process too and decodes through its own runner (``runners["decode"]``) with a ``StaticCache``,
  in a process of its own (benchmarks/peer_runner.py), in the same interleaved rounds (``--no-peer`` leaves it out).
- The per-step Python overhead of ``ExportedModel.generate`` is measured on a tiny Llama (dynamo_overhead.py).

Timing: prefill = generate() start to the first new token (time to first token); decode tok/s = (new tokens - 1) /
(time from the first to the last new token). Best of ``--repeats`` rounds.

    python benchmarks/bench_dynamo.py            # the full run (what `make bench` runs), ~5-8 min on 2 cores
    python benchmarks/bench_dynamo.py --quick    # 16 new tokens, 1 round: a smoke test of the script
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import peer_runner  # benchmarks/ is on sys.path: this script's folder, or put there by run.py
from dynamo_overhead import bench_overhead

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROMPT = "Once upon a time, in a small village at the edge of a great forest, there lived"
VARIANTS = {
    "dynamic": "Dynamo, dynamic cache",
    "static": "Dynamo, static cache 256 + multi-token decode",
}
# Opt-in (--gqa-experiment): the static export traced with transformers' TRANSFORMERS_SDPA_FORCE_GQA=1, so attention
# calls sdpa(enable_gqa=True) instead of repeat_kv, which copies the whole K/V cache of every layer at every step
# in the exported graph (eager avoids it with pack_gqa, which transformers skips while tracing).
EXPERIMENTS = {
    "static-gqa": "Dynamo, static cache 256 + multi-token decode, traced with sdpa enable_gqa",
}
PEER = {"peer": "peer: transformers.exporters Dynamo, static cache 256 + multi-token decode, its own runner "
                "`runners['decode']` with a StaticCache"}
STATIC_CACHE_LEN = 256
_OVERHEAD_SECTION_S = 60  # what the tiny-model section after the rounds takes, about


# --- helpers ---------------------------------------------------------------------------------------------------


def peak_rss_mb() -> float:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def machine_line() -> str:
    cpu = platform.processor() or "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    import transformers

    return (
        f"{cpu}, {os.cpu_count()} cores ({torch.get_num_threads()} torch threads), "
        f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB RAM; "
        f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}"
    )


def _static_generation_config(model: Any, max_cache_len: int) -> Any:
    from transformers import GenerationConfig

    g = model.generation_config
    return GenerationConfig(
        cache_implementation="static", max_cache_len=max_cache_len, do_sample=False,
        bos_token_id=g.bos_token_id, eos_token_id=g.eos_token_id, pad_token_id=g.pad_token_id,
    )


def export_variant(model: Any, sample: dict, variant: str, max_cache_len: int = STATIC_CACHE_LEN) -> Any:
    from hfexport import DynamoConfig, DynamoExporter

    if variant == "dynamic":
        return DynamoExporter().export_for_generation(model, sample, DynamoConfig(dynamic=True))
    if variant == "static-gqa":
        os.environ["TRANSFORMERS_SDPA_FORCE_GQA"] = "1"
        try:
            return export_variant(model, sample, "static", max_cache_len)
        finally:
            del os.environ["TRANSFORMERS_SDPA_FORCE_GQA"]
    if variant == "peer":
        from transformers.exporters.exporter_dynamo import DynamoConfig as PeerConfig
        from transformers.exporters.exporter_dynamo import DynamoExporter as PeerExporter

        return PeerExporter().export_for_generation(
            model, sample, PeerConfig(dynamic=True),
            generation_config=_static_generation_config(model, max_cache_len), multi_token_decode=True,
        )
    if variant == "static":
        return DynamoExporter().export_for_generation(
            model, sample, DynamoConfig(dynamic=True),
            generation_config=_static_generation_config(model, max_cache_len), multi_token_decode=True,
        )
    raise ValueError(variant)


@contextlib.contextmanager
def stderr_noise(record: dict) -> Any:
    """Collect what a block writes to stderr (torch.export.load's '--- Logging error ---' traceback, see README)."""
    saved, buffer = sys.stderr, io.StringIO()
    sys.stderr = buffer
    try:
        yield
    finally:
        sys.stderr = saved
        text = buffer.getvalue()
        record["logging_errors"] = record.get("logging_errors", 0) + text.count("--- Logging error ---")


# --- child: one export ---------------------------------------------------------------------------------------------


def export_child(variant: str, out: Path) -> dict:
    from hfexport.testing.packaged import packaged

    model, tokenizer = packaged("smollm2")
    sample = dict(tokenizer(["Hello, world!"], return_tensors="pt"))
    rss_before = peak_rss_mb()
    start = time.perf_counter()
    exported = export_variant(model, sample, variant)
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    exported.save_pretrained(out)
    save_s = time.perf_counter() - start
    files = {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()}
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    return {
        "variant": variant,
        "export_s": export_s,
        "save_s": save_s,
        "bytes": folder_bytes(out),
        "files": files,
        "model_weight_bytes": weights,
        "peak_rss_mb": peak_rss_mb(),
        "rss_after_model_load_mb": rss_before,
    }


def run_export_child(variant: str, out: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--export-child", variant, "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=900,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"export of {variant} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["child_wall_s"] = time.perf_counter() - start
    return result


# --- generation timing -------------------------------------------------------------------------------------------


def timed_generate(generate: Any, inputs: dict, new_tokens: int) -> tuple[list[int], dict]:
    """Greedy generation timed by a streamer (the same one `hfexport run` uses, for eager and exports alike)."""
    from hfexport.generation.streamers import TimingStreamer

    streamer = TimingStreamer()
    with torch.no_grad():
        out = generate(**inputs, max_new_tokens=new_tokens, do_sample=False, streamer=streamer)
    stats = streamer.stats()
    stats["decode_tok_s"] = stats.pop("decode_tokens_per_s") or float("nan")
    return out[0, inputs["input_ids"].shape[-1] :].tolist(), stats


def _generate_with_config(model: Any, config: Any, kwargs: dict) -> Any:
    """``model.generate`` with ``config`` carrying the generation arguments (passing both is deprecated)."""
    config = copy.deepcopy(config)
    for key in ("max_new_tokens", "do_sample"):
        if key in kwargs:
            setattr(config, key, kwargs.pop(key))
    return model.generate(**kwargs, generation_config=config)


def summarise(results: dict[str, dict]) -> list[int]:
    """Best prefill / decode per variant, and whether every round's tokens equal eager's (printed loudly if not).

    Returns eager's tokens.
    """
    reference = results["eager"]["round_tokens"][0]
    for name, res in results.items():
        res["decode_tok_s"] = max(s["decode_tok_s"] for s in res["rounds"])
        res["prefill_s"] = min(s["prefill_s"] for s in res["rounds"])
        # the peer's loop has no end-of-sequence stop: it is compared on the tokens eager produced
        length = len(reference) if name in PEER else None
        res["same_tokens"] = all(t[:length] == reference for t in res["round_tokens"])
        res["tokens"] = next((t for t in res["round_tokens"] if t != reference), res["round_tokens"][0])
        if res["same_tokens"]:
            continue
        got = res["tokens"]
        first = next((i for i, (a, b) in enumerate(zip(got, reference)) if a != b), min(len(got), len(reference)))
        res["first_diff"] = first
        print("\n" + "!" * 100 + f"\n!!! TOKEN MISMATCH: {name} differs from eager greedy at new token {first} "
              f"({len(got)} vs {len(reference)} tokens)\n!!! {name}: {got[first:first + 8]}\n"
              f"!!! eager: {reference[first:first + 8]}\n" + "!" * 100 + "\n", flush=True)
    return reference


def bench_smollm2(args: argparse.Namespace, workdir: Path) -> dict:
    from hfexport import ExportedModel
    from hfexport.testing.packaged import packaged

    variants = {**VARIANTS, **(EXPERIMENTS if args.gqa_experiment else {}), **({} if args.no_peer else PEER)}
    exports = {}
    for variant in variants:
        print(f"[bench] exporting SmolLM2-135M ({variants[variant]}) in a child process ...", flush=True)
        exports[variant] = run_export_child(variant, workdir / variant)
        e = exports[variant]
        print(f"[bench]   export {e['export_s']:.1f} s, save {e['save_s']:.1f} s, {e['bytes'] / 1e6:.0f} MB, "
              f"peak RSS {e['peak_rss_mb']:.0f} MB", flush=True)

    model, tokenizer = packaged("smollm2")
    inputs = dict(tokenizer(PROMPT, return_tensors="pt"))
    static_gc = _static_generation_config(model, STATIC_CACHE_LEN)
    runners: dict[str, Any] = {
        "eager": lambda **kw: model.generate(**kw),
        "eager-static": lambda **kw: _generate_with_config(model, static_gc, kw),
    }
    loads: dict[str, dict] = {}
    peer = peer_runner.RunnerLoop(workdir / "peer", STATIC_CACHE_LEN) if "peer" in variants else None
    for variant in variants:
        if variant in PEER:
            runners[variant] = None  # decoded by `peer`, in a process of its own
            continue
        record: dict = {}
        start = time.perf_counter()
        with stderr_noise(record):
            exported = ExportedModel.from_pretrained(workdir / variant)
        record["load_s"] = time.perf_counter() - start
        loads[variant] = record
        runners[variant] = exported.generate

    print("[bench] warm-up (4 tokens each) ...", flush=True)
    for fn in runners.values():
        if fn is not None:
            timed_generate(fn, inputs, 4)  # (the peer's child warms itself up)

    results: dict[str, dict] = {name: {"rounds": []} for name in runners}
    round_s = 0.0
    for r in range(args.repeats):
        elapsed = time.perf_counter() - args.started
        if r and elapsed + round_s + _OVERHEAD_SECTION_S > args.budget_s:
            print(f"[bench] skipping rounds {r + 1}..{args.repeats}: another round ({round_s:.0f} s) would pass the "
                  f"{args.budget_s:.0f} s budget ({elapsed:.0f} s spent)", flush=True)
            break
        start = time.perf_counter()
        for name, fn in runners.items():
            if fn is None:
                tokens, stats = peer.generate(inputs["input_ids"], args.new_tokens)
            else:
                tokens, stats = timed_generate(fn, inputs, args.new_tokens)
            results[name]["rounds"].append(stats)
            results[name].setdefault("round_tokens", []).append(tokens)
            print(f"[bench] round {r + 1}/{args.repeats} {name:13s} {len(tokens)} tokens, "
                  f"prefill {stats['prefill_s'] * 1e3:.0f} ms, decode {stats['decode_tok_s']:.1f} tok/s", flush=True)
        round_s = time.perf_counter() - start

    reference = summarise(results)
    return {
        "prompt": PROMPT,
        "prompt_tokens": int(inputs["input_ids"].shape[-1]),
        "new_tokens_requested": args.new_tokens,
        "rounds_done": len(results["eager"]["rounds"]),
        "text": tokenizer.decode(reference, skip_special_tokens=True),
        "exports": exports,
        "loads": loads,
        "results": results,
        "main_peak_rss_mb": peak_rss_mb(),
    }


# --- report --------------------------------------------------------------------------------------------------------


def _loads(values: Any) -> str:
    return "/".join(f"{v:.1f}" for v in values)


def render(report: dict) -> str:
    s = report["smollm2"]
    lines = [
        "# hfexport Dynamo benchmark",
        "",
        f"Machine: {report['machine']}",
        "",
        f"Load average (1/5/15 min) at start {_loads(report['load_start'])}, at end {_loads(report['load_end'])}: "
        f"with more runnable processes than the {os.cpu_count()} cores, absolute numbers drop; compare rows inside "
        "one run.",
        "",
        f"SmolLM2-135M-Instruct (fp32, packaged), batch 1, greedy, {s['new_tokens_requested']} new tokens requested, "
        f"prompt of {s['prompt_tokens']} tokens: \"{s['prompt']}\". Best of {s['rounds_done']} interleaved "
        "rounds (fastest prefill, fastest decode); prefill = time to first token; decode tok/s over the tokens after "
        "the first. Same tokens = every round's tokens equal eager's.",
        "",
        "| variant | export s | artifact MB | export peak RSS MB | load s | prefill ms | decode tok/s | vs eager "
        "| tokens | same tokens as eager |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    eager_rate = s["results"]["eager"]["decode_tok_s"]
    names = {"eager": "eager `model.generate` (dynamic cache)",
             "eager-static": "eager `model.generate` (static cache 256)", **VARIANTS, **EXPERIMENTS, **PEER}
    for name, res in s["results"].items():
        exp = s["exports"].get(name)
        load = s["loads"].get(name)
        load_cell = f"{load['load_s']:.1f}" if load else "–"  # the peer loads in its own process
        same = "yes" if res["same_tokens"] else f"**NO** (first diff at token {res.get('first_diff')})"
        lines.append(
            f"| {names[name]} | {exp['export_s']:.1f} | {exp['bytes'] / 1e6:.0f} | {exp['peak_rss_mb']:.0f} | "
            f"{load_cell} | " if exp else f"| {names[name]} | – | – | – | – | "
        )
        lines[-1] += (f"{res['prefill_s'] * 1e3:.0f} | {res['decode_tok_s']:.1f} | "
                      f"{res['decode_tok_s'] / eager_rate:.2f}x | {len(res['tokens'])} | {same} |")
    weights = next(iter(s["exports"].values()))["model_weight_bytes"]
    lines += [
        "",
        f"Model weights: {weights / 1e6:.0f} MB (fp32). Peak RSS of the generation process (eager model + both "
        f"exports loaded): {s['main_peak_rss_mb']:.0f} MB. Export s = `export_for_generation` wall time (prefill + "
        "decode graphs); artifact MB = the folder after `save_pretrained`.",
    ]
    files = {k: v["files"] for k, v in s["exports"].items()}
    lines.append("Files: " + "; ".join(
        f"{k}: " + ", ".join(f"{n} {b / 1e6:.0f} MB" for n, b in sorted(f.items()) if b > 1e6) for k, f in files.items()
    ) + ".")
    noisy = {k: v["logging_errors"] for k, v in s["loads"].items() if v.get("logging_errors")}
    if noisy:
        lines.append(f"`ExportedModel.from_pretrained` printed torch's '--- Logging error ---' traceback "
                     f"({', '.join(f'{k}: {n}x' for k, n in noisy.items())}): the weights_only fallback on the cache "
                     "in `example_inputs` (see benchmarks/README.md).")
    o = report["overhead"]
    lines += [
        "",
        f"## Per-step Python overhead of `ExportedModel.generate` ({o['model']}, {o['steps']} decode steps)",
        "",
        "| variant | decode step ms | inside `module()` ms | overhead ms/step | bare `module()` loop ms/step "
        "| same tokens as eager |",
        "|---|---|---|---|---|---|",
        f"| eager `model.generate` | {o['rows']['eager']['step_ms']:.2f} | – | – | – | – |",
    ]
    for variant in VARIANTS:
        r = o["rows"][variant]
        bare = f"{r['bare_loop_ms']:.2f}" if "bare_loop_ms" in r else "–"
        lines.append(f"| {VARIANTS[variant]} | {r['step_ms']:.2f} | {r['module_ms']:.2f} | {r['overhead_ms']:.2f} "
                     f"| {bare} | {'yes' if r['same_tokens'] else '**NO**'} |")
    lines += [
        "",
        "Overhead = wall time per decode step of `exported.generate` minus the time spent inside the decode "
        "program's `module()` call in the same steps (input selection, mask/position building, token choice, "
        "output unflattening). The bare loop is the guide's Dynamo loop (reused buffers, `module()` and argmax only).",
        "",
        f"Total benchmark wall time: {report['wall_s']:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--overhead-tokens", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="16 tokens, 1 round (smoke test)")
    parser.add_argument("--results", type=Path, default=HERE / "RESULTS_DYNAMO.md")
    parser.add_argument("--budget-s", type=float, default=570,
                        help="skip further rounds when the next one would end the run past this (default 570 s)")
    parser.add_argument("--gqa-experiment", action="store_true",
                        help="also export the static variant traced with sdpa enable_gqa (see EXPERIMENTS)")
    parser.add_argument("--no-peer", action="store_true", help="leave out transformers' own Dynamo export")
    parser.add_argument("--export-child", choices=[*VARIANTS, *EXPERIMENTS, *PEER], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)  # benchmarks/run.py passes every benchmark's options to each

    if args.export_child:
        print(json.dumps(export_child(args.export_child, args.out)))
        return 0
    if args.quick:
        args.new_tokens, args.repeats, args.overhead_tokens = 16, 1, 40

    start = args.started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="hfexport-bench-"))
    try:
        report: dict[str, Any] = {"machine": machine_line(), "repeats": args.repeats,
                                  "load_start": os.getloadavg()}
        print(f"[bench] {report['machine']}", flush=True)
        report["smollm2"] = bench_smollm2(args, workdir)
        print("[bench] per-step overhead on a tiny Llama ...", flush=True)
        report["overhead"] = bench_overhead(args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report["wall_s"] = time.perf_counter() - start
    report["load_end"] = os.getloadavg()
    text = render(report)
    print("\n" + text)
    if not args.quick:
        args.results.write_text(text)
        args.results.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str))
        print(f"[bench] wrote {args.results}")
    mismatched = [k for k, v in report["smollm2"]["results"].items() if not v["same_tokens"]]
    mismatched += [k for k, v in report["overhead"]["rows"].items() if v.get("same_tokens") is False]
    if mismatched:
        print(f"[bench] TOKEN MISMATCH vs eager: {', '.join(mismatched)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
