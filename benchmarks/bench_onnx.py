"""ONNX export vs eager PyTorch on SmolLM2-135M: export cost, artifact size, decode speed, same tokens.

What runs where:

- Each export variant runs in its own child process (``--export-child``), so its wall time is its own:
  ``export_for_generation`` then ``save_pretrained``, and the folder's size on disk against the model's weights.
- The peer, transformers' own ONNX exporter (``transformers.exporters``), exports the same model in a child process
  too (benchmarks/peer_onnx.py; ``--no-peer`` leaves it out) and decodes with the spec's ONNX Runtime loop on its
  ``decode.onnx``, the cache bound in place.
- Generation runs in this process, interleaved round by round (eager first, then each export loaded back with
  ``ExportedModel.from_pretrained``, then the peer), so tokens/s compare inside one run on one machine state. Every
  variant's greedy tokens are checked against eager's.
- The per-step overhead of ``ExportedModel.generate`` on ONNX Runtime is measured on a tiny Llama: the wall time of a
  decode step minus the time inside ``InferenceSession.run_with_iobinding`` in those same steps.

Timing: prefill = generate() start to the first new token; decode tok/s = (new tokens - 1) / (time from the first to
the last new token). Best of ``--repeats`` rounds.

    python benchmarks/bench_onnx.py            # the full run, writes benchmarks/RESULTS_ONNX.md (~6-9 min on 2 cores)
    python benchmarks/bench_onnx.py --quick    # 16 new tokens, 1 round: a smoke test of the script

From another script (``benchmarks/run.py``): ``bench_onnx.run(results)`` fills ``results["onnx"]`` and returns the
Markdown section.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import peer_onnx  # benchmarks/ is on sys.path: this script's folder, or put there by run.py

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROMPT = "Once upon a time, in a small village at the edge of a great forest, there lived"
STATIC_CACHE_LEN = 256
VARIANTS = {
    "static": "ONNX, static cache 256 + multi-token decode (one graph), no fusions",
    "static-fused": "ONNX, static cache 256 + multi-token decode (one graph), ort_fusions='cpu'",
    "dynamic-fused": "ONNX, dynamic cache (prefill + decode graphs), ort_fusions='cpu'",
}
# runtime variants: (export variant, label, ORT intra-op threads or None for ONNX Runtime's default)
RUNS = {
    "static": ("static", None),
    "static-fused": ("static-fused", None),
    "static-fused-1t": ("static-fused", 1),
    "dynamic-fused": ("dynamic-fused", None),
}


def _ensure_importable() -> None:
    try:
        import hfexport  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "src"))


def _static_generation_config(model: Any, max_cache_len: int) -> Any:
    gen = copy.deepcopy(model.generation_config)
    gen.cache_implementation, gen.max_cache_len, gen.do_sample = "static", max_cache_len, False
    return gen


def export_variant(model: Any, sample: dict, variant: str, max_cache_len: int = STATIC_CACHE_LEN) -> Any:
    from hfexport import OnnxConfig
    from hfexport.exporter_onnx import OnnxExporter

    fusions = "cpu" if variant.endswith("-fused") else None
    if variant.startswith("static"):
        return OnnxExporter().export_for_generation(
            model, sample, OnnxConfig(dynamic=True, ort_fusions=fusions),
            generation_config=_static_generation_config(model, max_cache_len), multi_token_decode=True,
        )
    return OnnxExporter().export_for_generation(model, sample, OnnxConfig(dynamic=True, ort_fusions=fusions))


# --- child: one export ---------------------------------------------------------------------------------------------


def export_child(variant: str, out: Path) -> dict:
    from hfexport.models.packaged import packaged

    if variant == "peer":
        return peer_onnx.export_child(out, STATIC_CACHE_LEN)
    model, tokenizer = packaged("smollm2")
    sample = dict(tokenizer(["Hello, world!"], return_tensors="pt"))
    start = time.perf_counter()
    exported = export_variant(model, sample, variant)
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    exported.save_pretrained(out)
    save_s = time.perf_counter() - start
    weights = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}  # tied weights once
    return {
        "variant": variant,
        "export_s": export_s,
        "save_s": save_s,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()),
        "files": {p.name: p.stat().st_size for p in out.iterdir() if p.is_file()},
        "weight_bytes": sum(weights.values()),
        "graphs": len({c.program is not None and id(c.program) for c in exported.components.values()}),
    }


def run_export_child(variant: str, out: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--export-child", variant, "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=1800,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ONNX export of {variant} failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- generation timing -------------------------------------------------------------------------------------------


def timed_generate(generate: Any, inputs: dict, new_tokens: int) -> tuple[list[int], dict]:
    from hfexport.run_cli import TimingStreamer

    streamer = TimingStreamer()
    with torch.no_grad():
        out = generate(**inputs, max_new_tokens=new_tokens, do_sample=False, streamer=streamer)
    stats = streamer.stats()
    stats["decode_tok_s"] = stats.pop("decode_tokens_per_s") or float("nan")
    return out[0, inputs["input_ids"].shape[-1] :].tolist(), stats


def _session_options(threads: int | None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    return options


def bench_smollm2(args: argparse.Namespace, workdir: Path) -> dict:
    from hfexport import ExportedModel
    from hfexport.models.packaged import packaged

    exports = {}
    variants = {**VARIANTS, **({} if args.no_peer else {"peer": peer_onnx.PEER_LABEL})}
    for variant, label in variants.items():
        print(f"[bench-onnx] exporting SmolLM2-135M ({label}) in a child process ...", flush=True)
        exports[variant] = e = run_export_child(variant, workdir / variant)
        print(f"[bench-onnx]   export {e['export_s']:.1f} s, save {e['save_s']:.1f} s, peak RSS "
              f"{e['peak_rss'] / 1e6:.0f} MB, {e['bytes'] / 1e6:.0f} MB for {e['weight_bytes'] / 1e6:.0f} MB of "
              "weights", flush=True)

    model, tokenizer = packaged("smollm2")
    inputs = dict(tokenizer(PROMPT, return_tensors="pt"))
    runners: dict[str, Any] = {"eager": lambda n: timed_generate(model.generate, inputs, n)}
    for name, (variant, threads) in RUNS.items():
        start = time.perf_counter()
        exported = ExportedModel.from_pretrained(workdir / variant, session_options=_session_options(threads))
        exports.setdefault(f"load:{name}", {"load_s": time.perf_counter() - start})
        runners[name] = lambda n, generate=exported.generate: timed_generate(generate, inputs, n)
    if not args.no_peer:
        start = time.perf_counter()
        loop = peer_onnx.SpecLoop(workdir / "peer" / "decode.onnx", STATIC_CACHE_LEN)
        exports["load:peer"] = {"load_s": time.perf_counter() - start}
        runners["peer"] = lambda n: loop.generate(inputs["input_ids"], n)
    print("[bench-onnx] warm-up (4 tokens each) ...", flush=True)
    for fn in runners.values():
        fn(4)
    results: dict[str, dict] = {name: {"rounds": [], "round_tokens": []} for name in runners}
    for r in range(args.repeats):
        for name, fn in runners.items():
            tokens, stats = fn(args.new_tokens)
            results[name]["rounds"].append(stats)
            results[name]["round_tokens"].append(tokens)
            print(f"[bench-onnx] round {r + 1}/{args.repeats} {name:16s} {len(tokens)} tokens, prefill "
                  f"{stats['prefill_s'] * 1e3:.0f} ms, decode {stats['decode_tok_s']:.1f} tok/s", flush=True)
    reference = results["eager"]["round_tokens"][0]
    for res in results.values():
        res["decode_tok_s"] = max(s["decode_tok_s"] for s in res["rounds"])
        res["prefill_s"] = min(s["prefill_s"] for s in res["rounds"])
        # the peer's loop has no end-of-sequence stop: compare the tokens eager produced
        res["same_tokens"] = all(t[: len(reference)] == reference for t in res["round_tokens"])
        res["tokens"] = len(res["round_tokens"][0])
        del res["round_tokens"]
    return {"prompt_tokens": int(inputs["input_ids"].shape[-1]), "new_tokens": args.new_tokens, "exports": exports,
            "results": results, "text": tokenizer.decode(reference, skip_special_tokens=True)}


# --- per-step overhead on a tiny model -------------------------------------------------------------------------


def bench_overhead(args: argparse.Namespace) -> dict:
    """Decode step wall time minus the time inside ONNX Runtime's run, on the tiny Llama (1 thread each side: its
    kernels are so small that a second thread only adds synchronisation)."""
    from hfexport.models.tiny import TINY_CASES

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        case = TINY_CASES["llama"]
        model = case.build()
        prompt = {k: v for k, v in case.inputs(1, 12).items()}
        steps = args.overhead_tokens
        rows = {}
        for variant in ("static", "static-fused"):
            exported = export_variant(model, case.inputs(1, 6), variant, max_cache_len=12 + steps + 8)
            exported.to(None, session_options=_session_options(1))
            runner = exported.runner("decode")
            inside: list[float] = []
            session = runner.session

            class _Timed:
                def run_with_iobinding(self, binding: Any, *rest: Any) -> None:
                    start = time.perf_counter()
                    session.run_with_iobinding(binding, *rest)
                    inside.append(time.perf_counter() - start)

                def __getattr__(self, name: str) -> Any:
                    return getattr(session, name)

            runner.session = _Timed()
            generate = lambda **kw: exported.generate(**kw, eos_token_id=None)  # noqa: E731
            timed_generate(generate, prompt, 8)
            inside.clear()
            _, stats = timed_generate(generate, prompt, steps + 1)
            step_ms = 1e3 * stats["decode_s"] / stats["decode_steps"]
            ort_ms = 1e3 * sum(inside[1 : stats["decode_steps"] + 1]) / stats["decode_steps"]
            rows[variant] = {"step_ms": step_ms, "ort_ms": ort_ms, "overhead_ms": step_ms - ort_ms}
        if not args.no_peer:
            rows["peer"] = peer_onnx.peer_overhead(steps)
        return {"model": "tiny Llama (2 layers, hidden 64), 1 thread", "steps": steps, "rows": rows}
    finally:
        torch.set_num_threads(threads)


# --- report --------------------------------------------------------------------------------------------------------


def render(report: dict) -> str:
    s, o = report["smollm2"], report["overhead"]
    eager = s["results"]["eager"]["decode_tok_s"]
    weights = next(e for e in s["exports"].values() if "weight_bytes" in e)["weight_bytes"]
    lines = [
        "## ONNX Runtime (CPU) vs eager PyTorch",
        "",
        f"SmolLM2-135M-Instruct, fp32, batch 1, greedy, {s['new_tokens']} new tokens, prompt of {s['prompt_tokens']} "
        f"tokens; best of {report['repeats']} interleaved rounds. Load average at start/end: "
        f"{'/'.join(f'{x:.1f}' for x in report['load_start'])} / {'/'.join(f'{x:.1f}' for x in report['load_end'])}.",
        "",
        "| variant | export s | export peak RSS MB | artifact MB (x weights) | load s | prefill ms | decode tok/s "
        "| vs eager | same tokens |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, res in s["results"].items():
        variant, threads = RUNS.get(name, ("peer", None) if name == "peer" else (None, None))
        exp = s["exports"].get(variant) if variant else None
        load = s["exports"].get(f"load:{name}", {})
        if name == "eager":
            label = "eager `model.generate` (dynamic cache)"
        elif name == "peer":
            label = peer_onnx.PEER_LABEL + ", the spec's decode loop on decode.onnx"
        else:
            label = VARIANTS[variant] + (f", {threads} ORT thread" if threads else "")
        cells = (f"{exp['export_s']:.1f} | {exp.get('peak_rss', float('nan')) / 1e6:.0f} | {exp['bytes'] / 1e6:.0f} "
                 f"({exp['bytes'] / weights:.2f}x) | {load.get('load_s', float('nan')):.1f}") if exp else "– | – | – | –"
        lines.append(f"| {label} | {cells} | {res['prefill_s'] * 1e3:.0f} | {res['decode_tok_s']:.1f} | "
                     f"{res['decode_tok_s'] / eager:.2f}x | {'yes' if res['same_tokens'] else '**NO**'} |")
    if "peer" in s["results"]:
        peer = s["results"]["peer"]["decode_tok_s"]
        best = max((r["decode_tok_s"], n) for n, r in s["results"].items() if n not in ("eager", "peer"))
        lines += ["", f"Fastest hfexport variant ({best[1]}) vs the peer: {best[0] / peer:.2f}x decode tok/s."]
    lines += [
        "",
        f"Weights: {weights / 1e6:.0f} MB. Files: " + "; ".join(
            f"{v}: " + ", ".join(f"{n} {b / 1e6:.1f} MB" for n, b in sorted(e["files"].items()) if b > 1e5)
            for v, e in s["exports"].items() if "files" in e) + ".",
        "",
        f"Per-step overhead of `ExportedModel.generate` on ONNX Runtime ({o['model']}, {o['steps']} decode steps):",
        "",
        "| variant | decode step ms | inside ORT run ms | overhead ms/step |",
        "|---|---|---|---|",
    ]
    for variant, row in o["rows"].items():
        label = ("peer: its runner `ExportedModel.runners['decode']` in the spec's loop (it has no generate())"
                 if variant == "peer" else f"hfexport `ExportedModel.generate`: {VARIANTS[variant]}")
        lines.append(f"| {label} | {row['step_ms']:.3f} | {row['ort_ms']:.3f} | {row['overhead_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def run(results: dict, quick: bool = False, repeats: int = 2, new_tokens: int = 128, no_peer: bool = False) -> str:
    """Run the ONNX benchmark; store its report in ``results["onnx"]`` and return the Markdown section."""
    _ensure_importable()
    args = argparse.Namespace(repeats=1 if quick else repeats, new_tokens=16 if quick else new_tokens,
                              overhead_tokens=40 if quick else 200, no_peer=no_peer)
    workdir = Path(tempfile.mkdtemp(prefix="hfexport-bench-onnx-"))
    report: dict[str, Any] = {"repeats": args.repeats, "load_start": os.getloadavg()}
    start = time.perf_counter()
    try:
        report["smollm2"] = bench_smollm2(args, workdir)
        print("[bench-onnx] per-step overhead on a tiny Llama ...", flush=True)
        report["overhead"] = bench_overhead(args)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report["load_end"] = os.getloadavg()
    report["wall_s"] = time.perf_counter() - start
    results["onnx"] = report
    return render(report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="16 tokens, 1 round (smoke test)")
    parser.add_argument("--results", type=Path, default=HERE / "RESULTS_ONNX.md")
    parser.add_argument("--no-peer", action="store_true",
                        help="leave out transformers' own ONNX export (its export alone takes ~4 min)")
    parser.add_argument("--export-child", choices=[*VARIANTS, "peer"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)  # benchmarks/run.py passes every benchmark's options to each
    _ensure_importable()
    if args.export_child:
        print(json.dumps(export_child(args.export_child, args.out)))
        return 0
    results: dict = {}
    text = run(results, quick=args.quick, repeats=args.repeats, new_tokens=args.new_tokens, no_peer=args.no_peer)
    print("\n" + text)
    if not args.quick:
        args.results.write_text(text)
        args.results.with_suffix(".json").write_text(json.dumps(results["onnx"], indent=2, default=str))
        print(f"[bench-onnx] wrote {args.results}")
    mismatched = [k for k, v in results["onnx"]["smollm2"]["results"].items() if not v["same_tokens"]]
    if mismatched:
        print(f"[bench-onnx] TOKEN MISMATCH vs eager: {', '.join(mismatched)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
