"""OpenVINO export vs eager PyTorch and vs transformers' own OpenVINO export, on SmolLM2-135M (CPU).

What runs where:

- Each export runs in its own child process (``--export-child``), so its wall time and peak RSS are its own:
  ``export_for_generation`` (multi-token decode: one IR serves the prompt and every step; the model's growing cache,
  the recommended recipe, or a static cache of 256) then ``save_pretrained``; the IR's bytes on disk against the
  model's weight bytes.
- The peer is ``transformers.exporters``' ``OpenVINOExporter`` with the same settings, stateless and stateful. It has no
  ``generate()``; its IR is driven here by a plain loop over OpenVINO Runtime (the prompt in one call, then one token
  per call; the stateless IR gets its cache outputs back as inputs, the stateful one keeps them in its variables),
  compiled with the same f32 precision hint as ours so that its tokens can be compared with eager's.
- Generation runs in this process, interleaved round by round (eager first), so tokens/s compare inside one run on one
  machine state. fp32 (the target) and bf16 (``config={"INFERENCE_PRECISION_HINT": "bf16"}``, the CPU plugin's own
  default on this processor) are reported separately.

Timing: prefill = generate() start to the first new token; decode tok/s = (new tokens - 1) / (time from the first to
the last new token). Best of ``--repeats`` rounds.

    python benchmarks/bench_openvino.py            # the full run, writes benchmarks/RESULTS_OPENVINO.md
    python benchmarks/bench_openvino.py --quick    # 16 new tokens, 1 round, no peer: a smoke test of the script
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import (  # benchmarks/ is on sys.path: this script's folder, or put there by run.py
    EAGER_LABEL, PROMPT, STATIC_CACHE_LEN, base_parser, ensure_importable, export_cells, export_summary, files_line,
    interleaved_rounds, loads, loop_stats, measure_export, result_cells, run_export_child, run_main,
    static_generation_config, summarise, table_head, timed_generate, timed_run, token_mismatch, warm_up,
)

HERE = Path(__file__).resolve().parent
F32 = {"INFERENCE_PRECISION_HINT": "f32"}
BF16 = {"INFERENCE_PRECISION_HINT": "bf16"}
EXPORTS = {
    "growing": "hfexport OpenVINO, stateful, growing (dynamic) cache + multi-token decode (one IR; the plugin's "
    "stateful attention)",
    "stateful": "hfexport OpenVINO, stateful (cache in variables), static cache 256 + multi-token decode (one IR)",
    "stateless": "hfexport OpenVINO, stateless (cache as inputs/outputs), static cache 256 + multi-token decode",
    "peer-stateless": "transformers.exporters OpenVINO (peer), stateful=False, static cache 256 + multi-token decode",
    "peer-stateful": "transformers.exporters OpenVINO (peer), stateful=True, static cache 256 + multi-token decode",
}
# runtime variants: name -> (export, compile config, label suffix)
RUNS = {
    "growing": ("growing", None, "fp32 (default)"),
    "stateful": ("stateful", None, "fp32 (default)"),
    "stateless": ("stateless", None, "fp32 (default)"),
    "stateful-bf16": ("stateful", BF16, "bf16 (explicit option)"),
    "peer-stateless": ("peer-stateless", F32, "fp32 hint"),
    "peer-stateful": ("peer-stateful", F32, "fp32 hint"),
}


# --- child: one export -----------------------------------------------------------------------------------------------


def export_child(variant: str, out: Path) -> dict:
    stateful = not variant.endswith("stateless")
    if variant.startswith("peer"):
        from transformers.exporters.exporter_openvino import OpenVINOConfig, OpenVINOExporter
    else:
        from hfexport.exporter_openvino import OpenVINOConfig, OpenVINOExporter

    def export(model: Any, sample: dict) -> Any:
        # "growing": the model's own (dynamic) cache, which the CPU plugin fuses into its stateful attention
        gen = None if variant == "growing" else static_generation_config(model)
        return OpenVINOExporter().export_for_generation(
            model, sample, OpenVINOConfig(dynamic=True, stateful=stateful), generation_config=gen,
            multi_token_decode=True,
        )

    record, _ = measure_export(variant, out, export)
    record["ir_bytes"] = sum(p.stat().st_size for p in out.rglob("*") if p.suffix in (".xml", ".bin"))
    return record


# --- the peer's IR in a plain loop -----------------------------------------------------------------------------------


class PeerLoop:
    """Greedy decoding over the peer's decode IR on OpenVINO Runtime: prompt in one call, then one token per call.

    Inputs it does not know by name are cache tensors (stateless: ``input.<leaf>``, fed back from ``output.<leaf>``).
    A stateful IR gets ``beam_idx = [0]`` and its state reset before each sequence.
    """

    def __init__(self, directory: Path, config: dict):
        import openvino as ov

        xml = next(p for p in sorted(directory.glob("*.xml")) if "decode" in p.name or len(list(
            directory.glob("*.xml"))) == 1)
        self.compiled = ov.Core().compile_model(str(xml), "CPU", {"PERFORMANCE_HINT": "LATENCY", **config})
        self.request = self.compiled.create_infer_request()
        self.inputs = {next(iter(p.get_names())): p for p in self.compiled.inputs}
        self.outputs = [next(iter(p.get_names()), "") for p in self.compiled.outputs]
        self.logits = next(i for i, n in enumerate(self.outputs) if n.endswith("logits"))
        config = json.loads((directory / "config.json").read_text())
        self.kv_heads = config.get("num_key_value_heads") or config["num_attention_heads"]
        self.head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]

    def _cache_inputs(self) -> dict[str, np.ndarray]:
        """Zeros for every cache input: K/V ``[1, kv_heads, STATIC_CACHE_LEN, head_dim]`` (the IR's dims are all
        dynamic), counters ``[]``."""
        cache = {}
        for name, port in self.inputs.items():
            if name.startswith("input.") and name not in ("input.input_ids",):
                leaf = name[len("input."):]
                if leaf in ("input_ids", "attention_mask", "position_ids", "cache_position"):
                    continue
                rank = port.get_partial_shape().rank.get_length()
                shape = [1, self.kv_heads, STATIC_CACHE_LEN, self.head_dim] if rank == 4 else [1] * rank
                cache[name] = np.zeros(shape, dtype=port.get_element_type().to_dtype())
        return cache

    def _feed(self, name: str, value: np.ndarray, feed: dict) -> None:
        for key in (name, f"input.{name}"):
            if key in self.inputs:
                feed[key] = value

    def generate(self, prompt_ids: torch.Tensor, new_tokens: int) -> tuple[list[int], dict]:
        self.request.reset_state()
        cache = self._cache_inputs()
        ids = prompt_ids.numpy().astype(np.int64)
        slots = np.arange(STATIC_CACHE_LEN)
        tokens: list[int] = []
        start = time.perf_counter()
        first = start
        length = 0
        for step in range(new_tokens):
            q = ids if step == 0 else np.array([[tokens[-1]]], dtype=np.int64)
            positions = np.arange(length, length + q.shape[1])
            feed: dict[str, np.ndarray] = dict(cache)
            self._feed("input_ids", q, feed)
            self._feed("position_ids", positions[None], feed)
            self._feed("cache_position", positions, feed)
            self._feed("attention_mask", (slots[None, :] <= positions[:, None])[None, None], feed)
            self._feed("beam_idx", np.zeros(1, dtype=np.int32), feed)
            result = self.request.infer(feed)
            values = list(result.values())
            for name in cache:
                out = "output." + name[len("input."):]
                if out in self.outputs:
                    cache[name] = np.array(values[self.outputs.index(out)])
            tokens.append(int(values[self.logits][0, -1].argmax()))
            length += q.shape[1]
            if step == 0:
                first = time.perf_counter()
        return tokens, loop_stats(start, first, time.perf_counter(), tokens)


# --- generation timing ---------------------------------------------------------------------------------------------


def _timed_generate(generate: Any, inputs: dict, new_tokens: int) -> tuple[list[int], dict]:
    """``timed_generate`` without the end-of-sequence stop: every run makes ``new_tokens`` tokens."""
    return timed_generate(generate, inputs, new_tokens, eos_token_id=None)


def bench_smollm2(args: argparse.Namespace, workdir: Path) -> dict:
    from hfexport import ExportedModel
    from hfexport.testing.packaged import packaged

    exports = {}
    for variant, label in EXPORTS.items():
        if (args.no_peer and variant.startswith("peer")) or (args.variants and variant not in args.variants):
            continue
        print(f"[bench-openvino] exporting SmolLM2-135M ({label}) in a child process ...", flush=True)
        exports[variant] = e = run_export_child(__file__, variant, workdir / variant, keep_going=True)
        if "error" in e:
            print(f"[bench-openvino]   export FAILED: {e['error']}", flush=True)
            continue
        print(f"[bench-openvino]   {export_summary(e, 'ir_bytes', 'IR ')}", flush=True)

    model, tokenizer = packaged("smollm2")
    inputs = dict(tokenizer(PROMPT, return_tensors="pt"))
    runners: dict[str, Any] = {"eager": lambda n: _timed_generate(model.generate, inputs, n)}
    for name, (variant, config, _) in RUNS.items():
        if variant not in exports or "error" in exports[variant]:
            continue
        start = time.perf_counter()
        try:
            if variant.startswith("peer"):
                loop = PeerLoop(workdir / variant, config)
                runners[name] = lambda n, loop=loop: loop.generate(inputs["input_ids"], n)
            else:
                kwargs = {"config": config} if config else {}
                exported = ExportedModel.from_pretrained(workdir / variant, **kwargs)
                runners[name] = lambda n, generate=exported.generate: _timed_generate(generate, inputs, n)
        except Exception as error:  # noqa: BLE001 - a peer IR our loop cannot drive is reported, not fatal
            exports[f"load:{name}"] = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
            continue
        exports[f"load:{name}"] = {"load_s": time.perf_counter() - start}
    warm_up(runners, "bench-openvino", errors=exports)
    results = interleaved_rounds(runners, args.repeats, args.new_tokens, "bench-openvino")
    reference = summarise(results)  # no EOS stop: every run has new_tokens tokens, compared whole
    return {"prompt_tokens": int(inputs["input_ids"].shape[-1]), "new_tokens": args.new_tokens, "exports": exports,
            "results": results, "text": tokenizer.decode(reference, skip_special_tokens=True)}


# --- report --------------------------------------------------------------------------------------------------------


def render(report: dict) -> str:
    s = report["smollm2"]
    eager = s["results"]["eager"]["decode_tok_s"]
    lines = [
        "## OpenVINO (CPU) vs eager PyTorch and transformers.exporters' OpenVINO export",
        "",
        f"SmolLM2-135M-Instruct, fp32 weights, batch 1, greedy, {s['new_tokens']} new tokens (no EOS stop), prompt "
        f"of {s['prompt_tokens']} tokens; best of {report['repeats']} interleaved rounds. Load average (2 cores) at "
        f"start/end: {loads(report)}.",
        "",
        *table_head("run", "export s", "export peak RSS MB", "IR MB (x weights)", "prefill ms", "decode tok/s",
                    "vs eager", "same tokens as eager"),
    ]
    for name, res in s["results"].items():
        variant, _, precision = RUNS.get(name, (None, None, ""))
        exp = s["exports"].get(variant) if variant else None
        label = EAGER_LABEL if name == "eager" else f"{EXPORTS[variant]}; {precision}"
        lines.append(f"| {label} | {export_cells(exp, 'ir_bytes')} | {result_cells(res, eager, where=True)} |")
    failed = {k: v["error"] for k, v in s["exports"].items() if "error" in v}
    if failed:
        lines += ["", "Failed: " + "; ".join(f"{k}: {v}" for k, v in failed.items())]
    if any("weight_bytes" in e for e in s["exports"].values()):
        lines += ["", files_line(s["exports"])]
    return "\n".join(lines) + "\n"


def run(results: dict, quick: bool = False, repeats: int = 2, new_tokens: int = 128, no_peer: bool = False,
        variants: list[str] | None = None) -> str:
    """Run the OpenVINO benchmark; store its report in ``results["openvino"]`` and return the Markdown section."""
    ensure_importable()
    args = argparse.Namespace(repeats=1 if quick else repeats, new_tokens=16 if quick else new_tokens,
                              no_peer=no_peer or quick, variants=variants)

    def body(workdir: Path, report: dict) -> None:
        report["smollm2"] = bench_smollm2(args, workdir)

    results["openvino"] = report = timed_run("hfexport-bench-openvino-", args.repeats, body)
    return render(report)


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__, HERE / "RESULTS_OPENVINO.md", "16 tokens, 1 round, no peer (smoke test)")
    parser.add_argument("--no-peer", action="store_true", help="leave out transformers' own OpenVINO export")
    parser.add_argument("--variants", type=lambda v: v.split(","), default=None,
                        help=f"comma-separated exports to run (default: all of {', '.join(EXPORTS)})")
    parser.add_argument("--export-child", choices=list(EXPORTS), help=argparse.SUPPRESS)
    args, _ = parser.parse_known_args(argv)  # benchmarks/run.py passes every benchmark's options to each
    report = run_main(args, "bench-openvino", "openvino", export_child, lambda results: run(
        results, quick=args.quick, repeats=args.repeats, new_tokens=args.new_tokens, no_peer=args.no_peer,
        variants=args.variants))
    if report is None:
        return 0
    return token_mismatch([k for k, v in report["smollm2"]["results"].items()
                           if not v["same_tokens"] and not k.startswith("peer") and "bf16" not in k], "bench-openvino")


if __name__ == "__main__":
    sys.exit(main())
