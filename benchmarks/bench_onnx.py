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
import sys
import time
from pathlib import Path
from typing import Any

import torch

import peer_onnx  # benchmarks/ is on sys.path: this script's folder, or put there by run.py
import peer_runner
from common import (
    EAGER_LABEL, PROMPT, STATIC_CACHE_LEN, TimedMethod, base_parser, ensure_importable, export_cells,
    export_summary, files_line, interleaved_rounds, loads, measure_export, ort_session_options, overhead_row,
    result_cells, run_export_child, run_main, static_generation_config, summarise, table_head, timed_generate,
    timed_run, token_mismatch, warm_up,
)

HERE = Path(__file__).resolve().parent
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


def export_variant(model: Any, sample: dict, variant: str, max_cache_len: int = STATIC_CACHE_LEN) -> Any:
    from hfexport import OnnxConfig
    from hfexport.exporter_onnx import OnnxExporter

    fusions = "cpu" if variant.endswith("-fused") else None
    if variant.startswith("static"):
        return OnnxExporter().export_for_generation(
            model, sample, OnnxConfig(dynamic=True, ort_fusions=fusions),
            generation_config=static_generation_config(model, max_cache_len), multi_token_decode=True,
        )
    return OnnxExporter().export_for_generation(model, sample, OnnxConfig(dynamic=True, ort_fusions=fusions))


# --- child: one export ---------------------------------------------------------------------------------------------


def export_child(variant: str, out: Path) -> dict:
    if variant == "peer":
        return peer_onnx.export_child(out, STATIC_CACHE_LEN)
    record, exported = measure_export(variant, out, lambda model, sample: export_variant(model, sample, variant))
    record["graphs"] = len({c.program is not None and id(c.program) for c in exported.components.values()})
    return record


# --- generation timing -------------------------------------------------------------------------------------------


def bench_smollm2(args: argparse.Namespace, workdir: Path) -> dict:
    from hfexport import ExportedModel
    from hfexport.testing.packaged import packaged

    exports = {}
    variants = {**VARIANTS, **({} if args.no_peer else {"peer": peer_onnx.PEER_LABEL})}
    for variant, label in variants.items():
        print(f"[bench-onnx] exporting SmolLM2-135M ({label}) in a child process ...", flush=True)
        exports[variant] = run_export_child(__file__, variant, workdir / variant, what="ONNX export")
        print(f"[bench-onnx]   {export_summary(exports[variant])}", flush=True)

    model, tokenizer = packaged("smollm2")
    inputs = dict(tokenizer(PROMPT, return_tensors="pt"))
    runners: dict[str, Any] = {"eager": lambda n: timed_generate(model.generate, inputs, n)}
    for name, (variant, threads) in RUNS.items():
        start = time.perf_counter()
        exported = ExportedModel.from_pretrained(workdir / variant, session_options=ort_session_options(threads))
        exports.setdefault(f"load:{name}", {"load_s": time.perf_counter() - start})
        runners[name] = lambda n, generate=exported.generate: timed_generate(generate, inputs, n)
    if not args.no_peer:
        start = time.perf_counter()
        loop = peer_onnx.SpecLoop(workdir / "peer" / "decode.onnx", STATIC_CACHE_LEN)
        exports["load:peer"] = {"load_s": time.perf_counter() - start}
        runners["peer"] = lambda n: loop.generate(inputs["input_ids"], n)
        own = peer_runner.RunnerLoop(workdir / "peer", STATIC_CACHE_LEN)
        runners["peer-runner"] = lambda n: own.generate(inputs["input_ids"], n)
    warm_up(runners, "bench-onnx")
    results = interleaved_rounds(runners, args.repeats, args.new_tokens, "bench-onnx")
    reference = summarise(results)  # the peer's loop has no end-of-sequence stop: compare the tokens eager produced
    return {"prompt_tokens": int(inputs["input_ids"].shape[-1]), "new_tokens": args.new_tokens, "exports": exports,
            "results": results, "text": tokenizer.decode(reference, skip_special_tokens=True)}


# --- per-step overhead on a tiny model -------------------------------------------------------------------------


def bench_overhead(args: argparse.Namespace) -> dict:
    """Decode step wall time minus the time inside ONNX Runtime's run, on the tiny Llama (1 thread each side: its
    kernels are so small that a second thread only adds synchronisation)."""
    from hfexport.testing.tiny import TINY_CASES

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
            exported.to(None, session_options=ort_session_options(1))
            runner = exported.runner("decode")
            runner.session = timed = TimedMethod(runner.session, "run_with_iobinding")
            inside = timed.times
            generate = lambda **kw: exported.generate(**kw, eos_token_id=None)  # noqa: E731
            timed_generate(generate, prompt, 8)
            inside.clear()
            _, stats = timed_generate(generate, prompt, steps + 1)
            step_ms = 1e3 * stats["decode_s"] / stats["decode_steps"]
            ort_ms = 1e3 * sum(inside[1 : stats["decode_steps"] + 1]) / stats["decode_steps"]
            rows[variant] = overhead_row(step_ms, ort_ms)
        if not args.no_peer:
            rows["peer"] = peer_onnx.peer_overhead(steps)
        return {"model": "tiny Llama (2 layers, hidden 64), 1 thread", "steps": steps, "rows": rows}
    finally:
        torch.set_num_threads(threads)


# --- report --------------------------------------------------------------------------------------------------------


def render(report: dict) -> str:
    s, o = report["smollm2"], report["overhead"]
    eager = s["results"]["eager"]["decode_tok_s"]
    lines = [
        "## ONNX Runtime (CPU) vs eager PyTorch",
        "",
        f"SmolLM2-135M-Instruct, fp32, batch 1, greedy, {s['new_tokens']} new tokens, prompt of {s['prompt_tokens']} "
        f"tokens; best of {report['repeats']} interleaved rounds. Load average at start/end: {loads(report)}.",
        "",
        *table_head("variant", "export s", "export peak RSS MB", "artifact MB (x weights)", "load s", "prefill ms",
                    "decode tok/s", "vs eager", "same tokens"),
    ]
    for name, res in s["results"].items():
        is_peer = name.startswith("peer")
        variant, threads = RUNS.get(name, ("peer", None) if is_peer else (None, None))
        exp = s["exports"].get(variant) if variant else None
        load = s["exports"].get(f"load:{name}", {})
        if name == "eager":
            label = EAGER_LABEL
        elif name == "peer":
            label = peer_onnx.PEER_LABEL + ", the spec's decode loop on decode.onnx (in-place io-binding)"
        elif name == "peer-runner":
            label = peer_onnx.PEER_LABEL + ", its own runner `runners['decode']` with a StaticCache"
        else:
            label = VARIANTS[variant] + (f", {threads} ORT thread" if threads else "")
        lines.append(f"| {label} | {export_cells(exp, load=load)} | {result_cells(res, eager)} |")
    if "peer" in s["results"]:
        best = max((r["decode_tok_s"], n) for n, r in s["results"].items()
                   if n != "eager" and not n.startswith("peer"))
        for name, how in (("peer", "the spec's in-place loop"), ("peer-runner", "its own runner")):
            if name in s["results"]:
                peer = s["results"][name]["decode_tok_s"]
                lines += ["", f"Fastest hfexport variant ({best[1]}) vs the peer with {how}: "
                          f"{best[0] / peer:.2f}x decode tok/s."]
    lines += [
        "",
        files_line(s["exports"]),
        "",
        f"Per-step overhead of `ExportedModel.generate` on ONNX Runtime ({o['model']}, {o['steps']} decode steps):",
        "",
        *table_head("variant", "decode step ms", "inside ORT run ms", "overhead ms/step"),
    ]
    for variant, row in o["rows"].items():
        label = ("peer: its runner `ExportedModel.runners['decode']` in the spec's loop (it has no generate())"
                 if variant == "peer" else f"hfexport `ExportedModel.generate`: {VARIANTS[variant]}")
        lines.append(f"| {label} | {row['step_ms']:.3f} | {row['ort_ms']:.3f} | {row['overhead_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def run(results: dict, quick: bool = False, repeats: int = 2, new_tokens: int = 128, no_peer: bool = False) -> str:
    """Run the ONNX benchmark; store its report in ``results["onnx"]`` and return the Markdown section."""
    ensure_importable()
    args = argparse.Namespace(repeats=1 if quick else repeats, new_tokens=16 if quick else new_tokens,
                              overhead_tokens=40 if quick else 200, no_peer=no_peer)

    def body(workdir: Path, report: dict) -> None:
        report["smollm2"] = bench_smollm2(args, workdir)
        print("[bench-onnx] per-step overhead on a tiny Llama ...", flush=True)
        report["overhead"] = bench_overhead(args)

    results["onnx"] = report = timed_run("hfexport-bench-onnx-", args.repeats, body)
    return render(report)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__, HERE / "RESULTS_ONNX.md", "16 tokens, 1 round (smoke test)")
    parser.add_argument("--no-peer", action="store_true",
                        help="leave out transformers' own ONNX export (its export alone takes ~4 min)")
    parser.add_argument("--export-child", choices=[*VARIANTS, "peer"], help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)  # benchmarks/run.py passes every benchmark's options to each
    report = run_main(args, "bench-onnx", "onnx", export_child, lambda results: run(
        results, quick=args.quick, repeats=args.repeats, new_tokens=args.new_tokens, no_peer=args.no_peer))
    if report is None:
        return 0
    return token_mismatch([k for k, v in report["smollm2"]["results"].items() if not v["same_tokens"]], "bench-onnx")


if __name__ == "__main__":
    sys.exit(main())
