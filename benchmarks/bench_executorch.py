"""ExecuTorch (XNNPACK, fp32) export vs eager PyTorch on SmolLM2-135M: where the export time goes, peak RSS, ``.pte``
size against the weights, decode speed, same tokens.

- The export runs in a child process (``--export-child``) so its wall time and peak RSS are its own:
  ``export_for_generation`` with a static cache of 256 and multi-token decode (one ``.pte`` serves the prompt and
  every step), then ``save_pretrained``. Its phases are timed: capture + ``torch.export`` ("trace"),
  ``to_edge_transform_and_lower`` (edge dialect + XNNPACK partition and preprocessing), ``to_executorch`` (memory
  planning, emit) and serialisation (``save_pretrained``: writing the ``.pte``).
- Generation runs in this process, interleaved round by round (eager ``model.generate`` first, then
  ``ExportedModel.generate`` on the ``.pte`` loaded back with ``from_pretrained``), greedy tokens checked against
  eager's. Each decode step is split into the time inside ``Method.execute`` and the rest (flattening the step's
  inputs, unflattening, the generate loop; the static cache lives in the method's mutable buffers).
- transformers' own ExecuTorch exporter is not re-run by default (its export_for_generation takes ~720 s here, see
  the issue); ``--peer`` runs it in a child process for the side-by-side wall time and size.

    python benchmarks/bench_executorch.py            # full run, writes benchmarks/RESULTS_EXECUTORCH.md
    python benchmarks/bench_executorch.py --quick    # 16 new tokens, 1 round
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

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
PROMPT = "Once upon a time, in a small village at the edge of a great forest, there lived"
STATIC_CACHE_LEN = 256
LABEL = "ExecuTorch XNNPACK fp32, static cache 256 kept in the .pte (mutable buffers) + multi-token decode (one .pte)"


def _ensure_importable() -> None:
    try:
        import hfexport  # noqa: F401
    except ImportError:
        sys.path.insert(0, str(REPO / "src"))


def _static_generation_config(model: Any) -> Any:
    gen = copy.deepcopy(model.generation_config)
    gen.cache_implementation, gen.max_cache_len, gen.do_sample = "static", STATIC_CACHE_LEN, False
    return gen


# --- child: one export -----------------------------------------------------------------------------------------------


def export_child(variant: str, out: Path) -> dict:
    from hfexport.models.packaged import packaged

    model, tokenizer = packaged("smollm2")
    sample = dict(tokenizer(["Hello, world!"], return_tensors="pt"))
    weights = {p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}  # tied weights once
    if variant == "peer":
        from transformers.exporters.exporter_executorch import ExecutorchConfig, ExecutorchExporter

        start = time.perf_counter()
        exported = ExecutorchExporter().export_for_generation(
            model, sample, ExecutorchConfig(dynamic=True), generation_config=_static_generation_config(model),
            multi_token_decode=True)
        phases = {}
    else:
        from hfexport import ExecutorchConfig
        from hfexport.exporter_executorch import ExecutorchExporter

        exporter = ExecutorchExporter()
        start = time.perf_counter()
        exported = exporter.export_for_generation(
            model, sample, ExecutorchConfig(dynamic=True), generation_config=_static_generation_config(model),
            multi_token_decode=True)
        phases = {k: sum(t.get(k, 0.0) for t in exporter.phase_timings) for k in exporter.phase_timings[0]}
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    exported.save_pretrained(out)
    save_s = time.perf_counter() - start
    phases["capture (decompose, outside torch.export)"] = export_s - sum(phases.values()) if phases else None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "cpu_s": usage.ru_utime + usage.ru_stime,  # the whole child (model load included): independent of the load
        "variant": variant, "export_s": export_s, "save_s": save_s, "phases": phases,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "bytes": sum(p.stat().st_size for p in out.rglob("*") if p.is_file()),
        "files": {p.name: p.stat().st_size for p in out.rglob("*") if p.is_file()},
        "weight_bytes": sum(weights.values()),
    }


def run_export_child(variant: str, out: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--export-child", variant, "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=3600,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"ExecuTorch export ({variant}) failed (rc={proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- generation --------------------------------------------------------------------------------------------------------


def timed_generate(generate: Any, inputs: dict, new_tokens: int) -> tuple[list[int], dict]:
    from hfexport.run_cli import TimingStreamer

    streamer = TimingStreamer()
    with torch.no_grad():
        out = generate(**inputs, max_new_tokens=new_tokens, do_sample=False, streamer=streamer)
    stats = streamer.stats()
    stats["decode_tok_s"] = stats.pop("decode_tokens_per_s") or float("nan")
    return out[0, inputs["input_ids"].shape[-1]:].tolist(), stats


class _TimedMethod:
    """Wraps ``executorch.runtime.Method``: records the seconds of each ``execute``."""

    def __init__(self, method: Any):
        self.method, self.times = method, []

    def execute(self, inputs: Any) -> Any:
        start = time.perf_counter()
        out = self.method.execute(inputs)
        self.times.append(time.perf_counter() - start)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.method, name)


def bench_smollm2(args: argparse.Namespace, workdir: Path) -> dict:
    from hfexport import ExportedModel
    from hfexport.models.packaged import packaged

    exports = {}
    for variant in ["static", *(["peer"] if args.peer else [])]:
        print(f"[bench-executorch] exporting SmolLM2-135M ({variant}) in a child process ...", flush=True)
        exports[variant] = e = run_export_child(variant, workdir / variant)
        print(f"[bench-executorch]   export {e['export_s']:.1f} s ({e['phases']}), child CPU {e['cpu_s']:.0f} s, "
              f"save {e['save_s']:.1f} s, peak "
              f"RSS {e['peak_rss'] / 1e6:.0f} MB, {e['bytes'] / 1e6:.0f} MB for {e['weight_bytes'] / 1e6:.0f} MB "
              "of weights", flush=True)

    model, tokenizer = packaged("smollm2")
    inputs = dict(tokenizer(PROMPT, return_tensors="pt"))
    start = time.perf_counter()
    exported = ExportedModel.from_pretrained(workdir / "static")
    load_s = time.perf_counter() - start
    runner = exported.runner("decode")
    timed = _TimedMethod(runner.method)
    runner.method = timed
    runners = {"eager": model.generate, "executorch": exported.generate}
    print("[bench-executorch] warm-up (4 tokens each) ...", flush=True)
    for fn in runners.values():
        timed_generate(fn, inputs, 4)
    results: dict[str, dict] = {name: {"rounds": [], "round_tokens": []} for name in runners}
    inside = []
    for r in range(args.repeats):
        for name, fn in runners.items():
            timed.times.clear()
            tokens, stats = timed_generate(fn, inputs, args.new_tokens)
            if name == "executorch":
                steps = stats["decode_steps"]
                inside.append(1e3 * sum(timed.times[1:steps + 1]) / steps)
                stats["step_ms"], stats["execute_ms"] = 1e3 * stats["decode_s"] / steps, inside[-1]
            results[name]["rounds"].append(stats)
            results[name]["round_tokens"].append(tokens)
            print(f"[bench-executorch] round {r + 1}/{args.repeats} {name:10s} {len(tokens)} tokens, prefill "
                  f"{stats['prefill_s'] * 1e3:.0f} ms, decode {stats['decode_tok_s']:.1f} tok/s", flush=True)
    reference = results["eager"]["round_tokens"][0]
    for res in results.values():
        best = max(res["rounds"], key=lambda s: s["decode_tok_s"])
        res["decode_tok_s"], res["prefill_s"] = best["decode_tok_s"], min(s["prefill_s"] for s in res["rounds"])
        res["step_ms"], res["execute_ms"] = best.get("step_ms"), best.get("execute_ms")
        res["same_tokens"] = all(t == reference for t in res["round_tokens"])
        res["tokens"] = len(res["round_tokens"][0])
        del res["round_tokens"]
    return {"prompt_tokens": int(inputs["input_ids"].shape[-1]), "new_tokens": args.new_tokens, "exports": exports,
            "load_s": load_s, "results": results, "text": tokenizer.decode(reference, skip_special_tokens=True)}


# --- report ----------------------------------------------------------------------------------------------------------


def render(report: dict) -> str:
    s = report["smollm2"]
    e = s["exports"]["static"]
    eager, ours = s["results"]["eager"], s["results"]["executorch"]
    weights = e["weight_bytes"]
    lines = [
        "## ExecuTorch (XNNPACK, CPU) vs eager PyTorch",
        "",
        f"SmolLM2-135M-Instruct, fp32, batch 1, greedy, {s['new_tokens']} new tokens, prompt of {s['prompt_tokens']} "
        f"tokens; best of {report['repeats']} interleaved rounds. Load average at start/end: "
        f"{'/'.join(f'{x:.1f}' for x in report['load_start'])} / {'/'.join(f'{x:.1f}' for x in report['load_end'])}"
        " (2 cores, shared).",
        "",
        "| variant | export s | export peak RSS MB | artifact MB (x weights) | load s | prefill ms | decode tok/s "
        "| vs eager | same tokens |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| eager `model.generate` (dynamic cache) | – | – | – | – | {eager['prefill_s'] * 1e3:.0f} | "
        f"{eager['decode_tok_s']:.1f} | 1.00x | yes |",
        f"| {LABEL} | {e['export_s']:.1f} | {e['peak_rss'] / 1e6:.0f} | {e['bytes'] / 1e6:.0f} "
        f"({e['bytes'] / weights:.2f}x) | {s['load_s']:.1f} | {ours['prefill_s'] * 1e3:.0f} | "
        f"{ours['decode_tok_s']:.1f} | {ours['decode_tok_s'] / eager['decode_tok_s']:.2f}x | "
        f"{'yes' if ours['same_tokens'] else '**NO**'} |",
    ]
    if "peer" in s["exports"]:
        p = s["exports"]["peer"]
        lines.append(f"| transformers' own ExecutorchExporter (same config) | {p['export_s']:.1f} | "
                     f"{p['peak_rss'] / 1e6:.0f} | {p['bytes'] / 1e6:.0f} ({p['bytes'] / weights:.2f}x) | – | – | – "
                     "| – | – |")
    lines += [
        "",
        "Where the export time goes: " + ", ".join(f"{k} {v:.1f} s" for k, v in e["phases"].items() if v is not None)
        + f", save (serialise the .pte) {e['save_s']:.1f} s. CPU time of the whole export process (loading the model "
        f"included): {e['cpu_s']:.0f} s.",
        "",
        f"A decode step: {ours['step_ms']:.1f} ms, of which {ours['execute_ms']:.1f} ms inside `Method.execute` "
        f"(the rest, {ours['step_ms'] - ours['execute_ms']:.1f} ms, is flattening the step's inputs, rebuilding the "
        "output and the generate loop; the cache stays inside the method and is not copied).",
        "",
        f"Weights: {weights / 1e6:.0f} MB. Files: " + ", ".join(
            f"{n} {b / 1e6:.1f} MB" for n, b in sorted(e["files"].items()) if b > 1e5) + ".",
    ]
    return "\n".join(lines) + "\n"


def run(results: dict, quick: bool = False, repeats: int = 2, new_tokens: int = 128, peer: bool = False) -> str:
    """Run the ExecuTorch benchmark; store its report in ``results["executorch"]`` and return the Markdown."""
    _ensure_importable()
    args = argparse.Namespace(repeats=1 if quick else repeats, new_tokens=16 if quick else new_tokens, peer=peer)
    workdir = Path(tempfile.mkdtemp(prefix="hfexport-bench-executorch-"))
    report: dict[str, Any] = {"repeats": args.repeats, "load_start": os.getloadavg()}
    start = time.perf_counter()
    try:
        report["smollm2"] = bench_smollm2(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report["load_end"] = os.getloadavg()
    report["wall_s"] = time.perf_counter() - start
    results["executorch"] = report
    return render(report)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="16 tokens, 1 round (smoke test)")
    parser.add_argument("--results", type=Path, default=HERE / "RESULTS_EXECUTORCH.md")
    parser.add_argument("--peer", action="store_true",
                        help="also run transformers' own ExecuTorch export (~12 min here)")
    parser.add_argument("--export-child", choices=["static", "peer"], help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)  # benchmarks/run.py passes every benchmark's options to each
    _ensure_importable()
    if args.export_child:
        print(json.dumps(export_child(args.export_child, args.out)))
        return 0
    results: dict = {}
    text = run(results, quick=args.quick, repeats=args.repeats, new_tokens=args.new_tokens, peer=args.peer)
    print("\n" + text)
    if not args.quick:
        args.results.write_text(text)
        args.results.with_suffix(".json").write_text(json.dumps(results["executorch"], indent=2, default=str))
        print(f"[bench-executorch] wrote {args.results}")
    if not results["executorch"]["smollm2"]["results"]["executorch"]["same_tokens"]:
        print("[bench-executorch] TOKEN MISMATCH vs eager", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
