"""ExecuTorch (XNNPACK, fp32) export vs eager PyTorch on SmolLM2-135M: where the export time goes, peak RSS, the
artifact's size against the weights, decode speed and where a decode step's time goes, same tokens.

- The export runs in a child process (``--export-child``, common.measure_export) so its wall time and peak RSS
  (VmHWM) are its own: ``export_for_generation`` with a static cache of 256 and multi-token decode (one ``.pte``
  serves the prompt and every step), then ``save_pretrained`` (the ``.pte`` and, for SmolLM2's tied embedding, the
  ``.ptd`` holding the weights once). Its phases are timed: capture + ``torch.export`` ("trace"),
  ``to_edge_transform_and_lower`` (edge dialect + XNNPACK partition and preprocessing), ``to_executorch`` (memory
  planning, emit) and serialisation (``save_pretrained``). A second export, in a child of its own, keeps the model's
  dynamic cache: a prefill and a decode program whose weights the save merges into one shared ``model.ptd``.
- Generation runs in this process, interleaved round by round (eager ``model.generate`` first, then
  ``ExportedModel.generate`` on the export loaded back with ``from_pretrained``), greedy tokens checked against
  eager's. Each decode step is split into the time inside ``Method.execute`` and the rest (flattening the step's
  inputs, unflattening, the generate loop; the static cache lives in the method's mutable buffers).
- The peer, transformers' own ExecuTorch exporter, exports the same model with the same recipe (static cache 256,
  multi-token decode, ``dynamic=True``: its static-shape export takes only the traced token count) in a child process
  (~720 s here; ``--no-peer`` leaves it out), and decodes through its own runner (``runners["decode"]``) with a
  ``StaticCache`` in a process of its own (benchmarks/peer_runner.py), in the same interleaved rounds.

    python benchmarks/bench_executorch.py            # full run, writes benchmarks/RESULTS_EXECUTORCH.md
    python benchmarks/bench_executorch.py --quick    # 16 new tokens, 1 round
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path
from typing import Any

from common import (  # benchmarks/ is on sys.path: this script's folder, or put there by run.py
    EAGER_LABEL, PROMPT, STATIC_CACHE_LEN, TimedMethod, base_parser, ensure_importable, export_cells, export_summary,
    files_line, interleaved_rounds, loads, measure_export, result_cells, run_export_child, run_main,
    static_generation_config, summarise, table_head, timed_generate, timed_run, token_mismatch, warm_up,
)
import peer_runner

HERE = Path(__file__).resolve().parent
LABEL = ("ExecuTorch XNNPACK fp32, static cache 256 kept in the .pte (mutable buffers) + multi-token decode (one "
         "program), llama::update_cache / custom_sdpa attention, weights once in a .ptd")
DYNAMIC_LABEL = ("ExecuTorch XNNPACK fp32, dynamic cache: a prefill and a decode program (the cache an input and an "
                 "output of each step), their weights once in one shared model.ptd")
PEER_LABEL = ("peer: transformers.exporters ExecuTorch XNNPACK, same recipe (static cache 256, multi-token decode, "
              "dynamic=True), its own runner `runners['decode']` with a StaticCache")


# --- child: one export -----------------------------------------------------------------------------------------------


def export_child(variant: str, out: Path) -> dict:
    phases: dict[str, float] = {}

    def export(model: Any, sample: dict) -> Any:
        config = static_generation_config(model)
        if variant == "peer":
            from transformers.exporters.exporter_executorch import ExecutorchConfig, ExecutorchExporter

            return ExecutorchExporter().export_for_generation(
                model, sample, ExecutorchConfig(dynamic=True), generation_config=config, multi_token_decode=True)
        from hfexport import ExecutorchConfig
        from hfexport.exporter_executorch import ExecutorchExporter

        exporter = ExecutorchExporter()
        if variant == "dynamic":  # the model's own (dynamic) cache: two programs sharing one model.ptd
            exported = exporter.export_for_generation(model, sample, ExecutorchConfig(dynamic=True))
        else:
            exported = exporter.export_for_generation(
                model, sample, ExecutorchConfig(dynamic=True), generation_config=config, multi_token_decode=True)
        for timing in exporter.stage_timings:  # each stage summed over the components; lower's own sub-steps
            for name, seconds in [(timing.stage, timing.seconds), *timing.parts.items()]:
                if name != "lower" or not timing.parts:  # lower's time is the sum of its parts
                    phases[name] = phases.get(name, 0.0) + seconds
        return exported

    record, _ = measure_export(variant, out, export)
    if phases:
        phases["outside the timed stages"] = record["export_s"] - sum(phases.values())
    usage = resource.getrusage(resource.RUSAGE_SELF)
    record["phases"] = phases
    record["cpu_s"] = usage.ru_utime + usage.ru_stime  # the whole child (model load included): independent of load
    return record


# --- generation ------------------------------------------------------------------------------------------------------


def bench_smollm2(args: argparse.Namespace, workdir: Path) -> dict:
    from hfexport import ExportedModel
    from hfexport.testing.packaged import packaged

    exports = {}
    for variant in ["static", "dynamic", *([] if args.no_peer else ["peer"])]:
        print(f"[bench-executorch] exporting SmolLM2-135M ({variant}) in a child process ...", flush=True)
        exports[variant] = e = run_export_child(__file__, variant, workdir / variant, what="ExecuTorch export",
                                                timeout=3600, keep_going=variant == "peer")
        if "error" in e:
            print(f"[bench-executorch]   the peer's export failed: {e['error']}", flush=True)
            continue
        print(f"[bench-executorch]   {export_summary(e)}; phases {e.get('phases')}, child CPU {e['cpu_s']:.0f} s",
              flush=True)

    model, tokenizer = packaged("smollm2")
    inputs = dict(tokenizer(PROMPT, return_tensors="pt"))
    start = time.perf_counter()
    exported = ExportedModel.from_pretrained(workdir / "static")
    exports["load:executorch"] = {"load_s": time.perf_counter() - start}
    runner = exported.runner("decode")
    timed = runner.method = TimedMethod(runner.method, "execute")

    def executorch(n: int) -> tuple[list[int], dict]:
        timed.times.clear()
        tokens, stats = timed_generate(exported.generate, inputs, n)
        steps = stats["decode_steps"]
        stats["execute_ms"] = 1e3 * sum(timed.times[1:steps + 1]) / steps  # the call after the prefill, per step
        stats["step_ms"] = 1e3 * stats["decode_s"] / steps
        return tokens, stats

    dynamic = ExportedModel.from_pretrained(workdir / "dynamic")
    runners = {"eager": lambda n: timed_generate(model.generate, inputs, n), "executorch": executorch,
               "executorch-dynamic": lambda n: timed_generate(dynamic.generate, inputs, n)}
    if "peer" in exports and "error" not in exports["peer"]:
        peer = peer_runner.RunnerLoop(workdir / "peer", STATIC_CACHE_LEN)
        runners["peer-runner"] = lambda n: peer.generate(inputs["input_ids"], n)
    warm_up(runners, "bench-executorch")
    results = interleaved_rounds(runners, args.repeats, args.new_tokens, "bench-executorch")
    ours = results["executorch"]
    best = max(ours["rounds"], key=lambda s: s["decode_tok_s"])
    reference = summarise(results)
    ours["step_ms"], ours["execute_ms"] = best["step_ms"], best["execute_ms"]
    return {"prompt_tokens": int(inputs["input_ids"].shape[-1]), "new_tokens": args.new_tokens, "exports": exports,
            "results": results, "text": tokenizer.decode(reference, skip_special_tokens=True)}


# --- report ----------------------------------------------------------------------------------------------------------


def render(report: dict) -> str:
    s = report["smollm2"]
    e = s["exports"]["static"]
    eager, ours = s["results"]["eager"], s["results"]["executorch"]
    lines = [
        "## ExecuTorch (XNNPACK, CPU) vs eager PyTorch",
        "",
        f"SmolLM2-135M-Instruct, fp32, batch 1, greedy, {s['new_tokens']} new tokens, prompt of {s['prompt_tokens']} "
        f"tokens; best of {report['repeats']} interleaved rounds. Load average at start/end: {loads(report)} "
        "(2 cores, shared).",
        "",
        *table_head("variant", "export s", "export peak RSS MB", "artifact MB (x weights)", "load s", "prefill ms",
                    "decode tok/s", "vs eager", "same tokens"),
        f"| {EAGER_LABEL} | {export_cells(None, load={})} | {result_cells(eager, eager['decode_tok_s'])} |",
        f"| {LABEL} | {export_cells(e, load=s['exports']['load:executorch'])} | "
        f"{result_cells(ours, eager['decode_tok_s'])} |",
    ]
    if "executorch-dynamic" in s["results"]:
        lines.append(f"| {DYNAMIC_LABEL} | {export_cells(s['exports']['dynamic'], load={})} | "
                     f"{result_cells(s['results']['executorch-dynamic'], eager['decode_tok_s'])} |")
    if "peer" in s["exports"]:
        peer = s["results"].get("peer-runner")
        lines.append(f"| {PEER_LABEL} | {export_cells(s['exports']['peer'], load={})} | "
                     + (f"{result_cells(peer, eager['decode_tok_s'])} |" if peer else
                        f"– | – | – | – ({s['exports']['peer'].get('error', 'not run')}) |"))
    lines += [
        "",
        "Where the export time goes: " + ", ".join(f"{k} {v:.1f} s" for k, v in e["phases"].items() if v is not None)
        + f", save (serialise the .pte and .ptd) {e['save_s']:.1f} s. CPU time of the whole export process (loading "
        f"the model included): {e['cpu_s']:.0f} s.",
        *(["", "The dynamic-cache export's time, both programs: " + ", ".join(
            f"{k} {v:.1f} s" for k, v in s["exports"]["dynamic"]["phases"].items() if v is not None)
           + f", save (the two .pte and the merged model.ptd) {s['exports']['dynamic']['save_s']:.1f} s."]
          if "dynamic" in s["exports"] else []),
        "",
        f"A decode step: {ours['step_ms']:.1f} ms, of which {ours['execute_ms']:.1f} ms inside `Method.execute` "
        f"(the rest, {ours['step_ms'] - ours['execute_ms']:.1f} ms, is flattening the step's inputs, rebuilding the "
        "output and the generate loop; the cache stays inside the method and is not copied).",
        "",
        files_line({k: v for k, v in s["exports"].items() if not k.startswith("load:")}),
    ]
    return "\n".join(lines) + "\n"


def run(results: dict, quick: bool = False, repeats: int = 2, new_tokens: int = 128, peer: bool = True) -> str:
    """Run the ExecuTorch benchmark; store its report in ``results["executorch"]`` and return the Markdown."""
    ensure_importable()
    args = argparse.Namespace(repeats=1 if quick else repeats, new_tokens=16 if quick else new_tokens, no_peer=not peer)

    def body(workdir: Path, report: dict) -> None:
        report["smollm2"] = bench_smollm2(args, workdir)

    results["executorch"] = report = timed_run("hfexport-bench-executorch-", args.repeats, body)
    return render(report)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__, HERE / "RESULTS_EXECUTORCH.md", "16 tokens, 1 round (smoke test)")
    parser.add_argument("--no-peer", action="store_true",
                        help="leave out transformers' own ExecuTorch export (~12 min here) and its decode row")
    parser.add_argument("--export-child", choices=["static", "dynamic", "peer"], help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)  # benchmarks/run.py passes every benchmark's options to each
    report = run_main(args, "bench-executorch", "executorch", export_child, lambda results: run(
        results, quick=args.quick, repeats=args.repeats, new_tokens=args.new_tokens, peer=not args.no_peer))
    if report is None:
        return 0
    return token_mismatch([k for k, v in report["smollm2"]["results"].items() if not v["same_tokens"]],
                          "bench-executorch")


if __name__ == "__main__":
    sys.exit(main())
