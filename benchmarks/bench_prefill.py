"""Prefill latency for a 512-token prompt, and forward parity on it, per backend, on SmolLM2-135M (CPU).

What runs:

- Eager PyTorch ``model.generate`` (dynamic cache): the reference tokens and the reference prefill time.
- Per backend, its recommended generation recipe, sized for the long prompt: ``export_for_generation`` with a
  static cache of ``--cache-len`` (640 = 512 + 128; OpenVINO: the model's growing cache, stateful) and a multi-token
  decode graph that also runs the prompt (ONNX with ``ort_fusions="cpu"``) and takes ``logits_to_keep`` (the prompt
  projects its last position only, as eager's; ``--no-logits-to-keep-input``: every position), saved and loaded back; ``generate`` of ``--new-tokens`` after the 512-token prompt.
  Prefill = from the ``generate`` call to the first new token (the same ``TimingStreamer`` for eager and exports);
  best of ``--repeats``; the greedy tokens must equal eager's.
- Forward parity: a plain ``export`` (no cache) of the same model, run on the 512-token prompt; the max abs diff of
  its logits against eager's (bound: 1e-4 for Dynamo, AOTI and ONNX, 1e-3 for OpenVINO and ExecuTorch, whose kernels
  reassociate sums).

ExecuTorch's two SmolLM2 exports take minutes (see RESULTS_EXECUTORCH.md); ``--backends`` picks fewer backends.

    python benchmarks/bench_prefill.py                      # all four; writes RESULTS_PREFILL.md/json
    python benchmarks/bench_prefill.py --backends dynamo,onnx
    python benchmarks/bench_prefill.py --quick              # 64-token prompt, 4 new tokens, dynamo only, writes nothing
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import ensure_importable, recipe_generation_config, timed_generate  # noqa: E402

DEFAULT_BACKENDS = ("dynamo", "onnx", "openvino", "executorch", "aoti")
RECIPE_OPTIONS = {"onnx": {"ort_fusions": "cpu"}}
TOLERANCE = {"dynamo": 1e-4, "onnx": 1e-4, "openvino": 1e-3, "executorch": 1e-3, "aoti": 1e-4}
TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined movable "
    "metal type, oil-based inks and a wooden screw press into a system that could produce books quickly and "
    "cheaply. Before that, texts were copied by hand, which made them rare and expensive. "
)


def long_prompt(tokenizer: Any, length: int) -> dict[str, torch.Tensor]:
    """Exactly ``length`` tokens of English text (the text repeated), batch 1."""
    ids = tokenizer(TEXT * (length // 20 + 1), return_tensors="pt")["input_ids"][:, :length]
    if ids.shape[1] != length:
        raise ValueError(f"the prompt text gives {ids.shape[1]} tokens, fewer than {length}")
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def _timed(generate: Any, prompt: dict, new_tokens: int) -> tuple[list[int], float]:
    tokens, stats = timed_generate(generate, prompt, new_tokens, min_new_tokens=new_tokens)
    return tokens, stats["prefill_s"]


def _best(generate: Any, prompt: dict, new_tokens: int, repeats: int) -> tuple[list[int], float]:
    tokens, best = None, float("inf")
    for _ in range(repeats):
        got, prefill = _timed(generate, prompt, new_tokens)
        if tokens is not None and got != tokens:
            raise AssertionError("two runs of the same export gave different tokens")
        tokens, best = got, min(best, prefill)
    return tokens, best


def bench_backend(backend: str, model: Any, tokenizer: Any, prompt: dict, args: argparse.Namespace,
                  workdir: Path, eager_logits: torch.Tensor) -> dict:
    from hfexport.registry import AutoExportConfig, AutoHfExporter
    from hfexport.validation import compare_outputs

    row: dict[str, Any] = {"backend": backend}
    options = {"export_format": backend, "dynamic": True}
    exported, row["generate_export_s"] = _recipe_export(backend, model, tokenizer, prompt, args, workdir,
                                                        args.logits_to_keep_input)
    # eager timed in the same rounds, interleaved: what the machine gives one moment (seen: eager 774-1190 ms over
    # one quiet hour, and a backend timed after another's in-process runtime slower than alone)
    row["tokens"], row["prefill_s"], row["eager_prefill_s"] = None, float("inf"), float("inf")
    for _ in range(args.repeats):
        with torch.no_grad():
            row["eager_prefill_s"] = min(row["eager_prefill_s"], _timed(model.generate, prompt, args.new_tokens)[1])
        tokens, prefill = _timed(exported.generate, prompt, args.new_tokens)
        if row["tokens"] is not None and tokens != row["tokens"]:
            raise AssertionError("two runs of the same export gave different tokens")
        row["tokens"], row["prefill_s"] = tokens, min(row["prefill_s"], prefill)
    del exported
    gc.collect()  # the runtime's sessions and threads gone before the next backend's

    plain = AutoExportConfig.from_dict(options)
    sample = dict(tokenizer(["Hello, world!"], return_tensors="pt"))
    start = time.perf_counter()
    forward = AutoHfExporter.from_config(plain).export(model, sample, config=plain)
    row["forward_export_s"] = time.perf_counter() - start
    got = forward(**prompt)
    report = compare_outputs(got.logits, eager_logits)
    row["max_abs_diff"] = report["max_abs_diff"]
    row["parity_ok"] = not report["problems"] and report["max_abs_diff"] <= TOLERANCE[backend]
    return row


def _recipe_export(backend: str, model: Any, tokenizer: Any, prompt: dict, args: argparse.Namespace, workdir: Path,
                   logits_to_keep_input: bool) -> tuple[Any, float]:
    """The backend's generation recipe exported, saved, loaded back and warmed up on ``prompt``; with its export
    seconds."""
    from hfexport import ExportedModel
    from hfexport.registry import AutoExportConfig, AutoHfExporter

    config = AutoExportConfig.from_dict({"export_format": backend, "dynamic": True, **RECIPE_OPTIONS.get(backend, {})})
    sample = dict(tokenizer(["Hello, world!"], return_tensors="pt"))
    start = time.perf_counter()
    exported = AutoHfExporter.from_config(config).export_for_generation(
        model, sample, config, generation_config=recipe_generation_config(backend, model, args.cache_len),
        multi_token_decode=True, logits_to_keep_input=logits_to_keep_input)
    seconds = time.perf_counter() - start
    folder = workdir / f"{backend}-generate-{logits_to_keep_input}"
    exported.save_pretrained(folder)
    del exported
    # an AOTInductor package is compiled code: loaded only when trusted (we built it a moment ago)
    loaded = ExportedModel.from_pretrained(folder, trust_remote_code=backend == "aoti")
    _timed(loaded.generate, prompt, 2)  # warm-up: first-call allocations and kernel selection
    return loaded, seconds


def ab_positions(backend: str, model: Any, tokenizer: Any, prompt: dict, args: argparse.Namespace,
                 workdir: Path) -> str:
    """``--ab``: the backend's recipe exported without and with ``logits_to_keep_input``, both loaded, their prefills
    and eager's timed in the same interleaved rounds (eager, without, with, ...); a markdown row with each one's best
    and the median of the rounds' paired ratios (without / with)."""
    import statistics

    loaded = {keep: _recipe_export(backend, model, tokenizer, prompt, args, workdir, keep)[0] for keep in (False, True)}
    rounds: dict[Any, list[float]] = {"eager": [], False: [], True: []}
    tokens = {}
    for _ in range(args.repeats):
        with torch.no_grad():
            rounds["eager"].append(_timed(model.generate, prompt, args.new_tokens)[1])
        for keep in (False, True):
            tokens[keep], seconds = _timed(loaded[keep].generate, prompt, args.new_tokens)
            rounds[keep].append(seconds)
    paired = statistics.median(a / b for a, b in zip(rounds[False], rounds[True]))
    best = {k: min(v) * 1e3 for k, v in rounds.items()}
    del loaded
    gc.collect()
    return (f"| {backend} | {best['eager']:.0f} | {best[False]:.0f} ({best['eager'] / best[False]:.2f}x) | "
            f"{best[True]:.0f} ({best['eager'] / best[True]:.2f}x) | {paired:.2f}x | "
            f"{'yes' if tokens[False] == tokens[True] else '**NO**'} |")


def run(args: argparse.Namespace) -> dict:
    from hfexport.testing.packaged import packaged

    torch.manual_seed(0)
    model, tokenizer = packaged("smollm2")
    prompt = long_prompt(tokenizer, args.prompt_len)
    with torch.no_grad():
        eager_logits = model(**prompt).logits
        _timed(model.generate, prompt, 2)
        eager_tokens, eager_prefill = _best(model.generate, prompt, args.new_tokens, args.repeats)
    report: dict[str, Any] = {
        "prompt_tokens": args.prompt_len, "new_tokens": args.new_tokens, "cache_len": args.cache_len,
        "repeats": args.repeats, "load_start": os.getloadavg(), "logits_to_keep_input": args.logits_to_keep_input,
        "eager": {"prefill_s": eager_prefill, "tokens": eager_tokens}, "backends": {},
    }
    with tempfile.TemporaryDirectory(prefix="hfexport-prefill-") as tmp:
        for backend in args.backends:
            print(f"[bench-prefill] {backend}: export (its generation recipe) and a {args.prompt_len}-token "
                  "prefill ...", flush=True)
            try:
                row = bench_backend(backend, model, tokenizer, prompt, args, Path(tmp), eager_logits)
            except Exception as error:  # one backend failing must not hide the others' numbers
                row = {"backend": backend, "error": f"{type(error).__name__}: {str(error)[:300]}"}
            row["same_tokens"] = row.get("tokens") == eager_tokens
            report["backends"][backend] = row
            print(f"[bench-prefill]   {render_row(row, eager_prefill)}", flush=True)
    report["load_end"] = os.getloadavg()
    return report


def render_row(row: dict, eager_prefill: float) -> str:
    if "error" in row:
        return f"{row['backend']}: failed: {row['error']}"
    eager_prefill = row.get("eager_prefill_s", eager_prefill)
    return (f"{row['backend']}: prefill {row['prefill_s'] * 1e3:.0f} ms ({eager_prefill / row['prefill_s']:.2f}x "
            f"eager), same tokens {row['same_tokens']}, forward max abs diff {row['max_abs_diff']:.1e}")


def render(report: dict) -> str:
    eager = report["eager"]["prefill_s"]
    load = lambda values: "/".join(f"{v:.1f}" for v in values)  # noqa: E731
    positions = "taking `logits_to_keep`: the prompt projects its last position only" \
        if report.get("logits_to_keep_input") else "projecting every prompt position through the LM head"
    lines = [
        f"## Prefill latency, {report['prompt_tokens']}-token prompt (SmolLM2-135M, fp32, batch 1, CPU)",
        "",
        f"`python benchmarks/bench_prefill.py`. Each backend's generation recipe with a static cache of "
        f"{report['cache_len']} (OpenVINO: its stateful growing cache) and one multi-token graph "
        f"({positions}); prefill = `generate()` call to the first new token, best "
        f"of {report['repeats']}; vs eager: against eager's best in the same rounds, interleaved with the "
        f"backend's (in parentheses; the first row: eager alone, before the backends); tokens = the first {report['new_tokens']} greedy tokens against eager's. Forward "
        f"parity: a plain export's logits on the same prompt against eager's. Load average at start/end: "
        f"{load(report['load_start'])} / {load(report['load_end'])}.",
        "",
        "| run | prefill ms | vs eager | same tokens | forward max abs diff | generate export s | forward export s |",
        "|---|---|---|---|---|---|---|",
        f"| eager `model.generate` (dynamic cache) | {eager * 1e3:.0f} | 1.00x | – | – | – | – |",
    ]
    for name, row in report["backends"].items():
        if "error" in row:
            lines.append(f"| {name} | failed: {row['error'].replace('|', '/')} | | | | | |")
            continue
        lines.append(
            f"| {name} | {row['prefill_s'] * 1e3:.0f} | {row.get('eager_prefill_s', eager) / row['prefill_s']:.2f}x "
            f"(eager {row.get('eager_prefill_s', eager) * 1e3:.0f}) | "
            f"{'yes' if row['same_tokens'] else '**NO**'} | {row['max_abs_diff']:.1e}"
            f"{'' if row['parity_ok'] else ' **over the bound**'} | {row['generate_export_s']:.1f} | "
            f"{row['forward_export_s']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", type=lambda v: tuple(v.split(",")), default=DEFAULT_BACKENDS)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--cache-len", type=int, default=640)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--logits-to-keep-input", action=argparse.BooleanOptionalAction, default=True,
                        help="the decode graph takes logits_to_keep, so the prompt projects its last position "
                             "only (default; --no-logits-to-keep-input: every position, as before)")
    parser.add_argument("--ab", action="store_true",
                        help="per backend: the recipe without and with logits_to_keep_input, timed in interleaved "
                             "rounds with eager; prints a table, writes nothing")
    parser.add_argument("--quick", action="store_true", help="64-token prompt, 4 new tokens, dynamo, writes nothing")
    parser.add_argument("--results", type=Path, default=HERE / "RESULTS_PREFILL.md")
    args, _ = parser.parse_known_args(argv)  # make bench passes every benchmark's options to each
    if args.quick:
        args.backends, args.prompt_len, args.new_tokens, args.cache_len, args.repeats = ("dynamo",), 64, 4, 96, 1
    ensure_importable()
    if args.ab:
        return _ab(args)
    report = run(args)
    text = render(report)
    print(text)
    if not args.quick:
        args.results.write_text(_with_notes(text, args.results))
        args.results.with_suffix(".json").write_text(json.dumps(report, indent=1))
        print(f"[bench-prefill] wrote {args.results}")
    rows = report["backends"].values()
    return 0 if all(r.get("same_tokens") and r.get("parity_ok") for r in rows) else 1


def _with_notes(text: str, path: Path) -> str:
    """``text`` followed by the sections of ``path`` after its first (the notes a run's table is read with)."""
    old = path.read_text() if path.exists() else ""
    cut = old.find("\n## ", 1)
    return text + old[cut:] if cut != -1 else text


def _ab(args: argparse.Namespace) -> int:
    from hfexport.testing.packaged import packaged

    torch.manual_seed(0)
    model, tokenizer = packaged("smollm2")
    prompt = long_prompt(tokenizer, args.prompt_len)
    print(f"load average at start: {os.getloadavg()}", flush=True)
    print("| backend | eager ms | every position ms (vs eager) | last position ms (vs eager) | paired ratio "
          "(median of rounds) | same tokens |\n|---|---|---|---|---|---|", flush=True)
    with tempfile.TemporaryDirectory(prefix="hfexport-prefill-ab-") as tmp:
        for backend in args.backends:
            print(ab_positions(backend, model, tokenizer, prompt, args, Path(tmp)), flush=True)
    print(f"load average at end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
