"""One table and one chart from every benchmark's results: ``benchmarks/RESULTS.md`` and ``benchmarks/RESULTS.png``.

``make bench`` (``benchmarks/run.py``) runs each benchmark, then this. Each benchmark times eager PyTorch in its own
run, interleaved with its exports, so every "vs eager" ratio divides by the eager figure of the same run. The roofline
line is measured here, at the end of the same ``make bench``: a stream copy of a 1 GiB numpy array
(``common.memory_bandwidth``) and the fp32 decode bound it gives for SmolLM2-135M's weight bytes; each row's decode
tokens/s is also given as a fraction of that bound.

    python benchmarks/summary.py            # from the RESULTS_*.json on disk; measures the bandwidth again
    python benchmarks/summary.py --keep-bandwidth  # the same, with the bandwidth of the last RESULTS_SUMMARY.json
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import decode_bound, memory_bandwidth  # noqa: E402

# (results file, run key, export key, backend, label): the rows of the table, in order. The first row of a backend is
# its recommended recipe, and carries that backend's 512-token prefill (bench_prefill).
ROWS = [
    ("RESULTS_DYNAMO", "static", "static", "dynamo", "hfexport Dynamo (.pt2), static cache 256, multi-token decode"),
    ("RESULTS_DYNAMO", "dynamic", "dynamic", "dynamo", "hfexport Dynamo, dynamic cache (prefill + decode programs)"),
    ("RESULTS_DYNAMO", "peer", "peer", "dynamo (peer)",
     "peer: transformers.exporters Dynamo, same static recipe, its own runner (runners['decode'])"),
    ("RESULTS_ONNX", "static-fused", "static-fused", "onnx",
     "hfexport ONNX Runtime, static cache 256, one graph, ort_fusions='cpu'"),
    ("RESULTS_ONNX", "dynamic-fused", "dynamic-fused", "onnx", "hfexport ONNX Runtime, dynamic cache, fused"),
    ("RESULTS_ONNX", "peer", "peer", "onnx (peer)",
     "peer: transformers.exporters ONNX, same recipe, spec's in-place io-binding loop"),
    ("RESULTS_ONNX", "peer-runner", "peer", "onnx (peer)",
     "peer: transformers.exporters ONNX, same recipe, its own runner (runners['decode'])"),
    ("RESULTS_OPENVINO", "growing", "growing", "openvino",
     "hfexport OpenVINO, stateful, growing cache, one multi-token IR (the plugin's stateful attention), fp32"),
    ("RESULTS_OPENVINO", "stateful", "stateful", "openvino", "hfexport OpenVINO, stateful, static cache 256, fp32"),
    ("RESULTS_OPENVINO", "stateless", "stateless", "openvino", "hfexport OpenVINO, stateless, static cache 256, fp32"),
    ("RESULTS_OPENVINO", "peer-stateless", "peer-stateless", "openvino (peer)",
     "peer: transformers.exporters OpenVINO, stateless, fp32 hint"),
    ("RESULTS_OPENVINO", "peer-stateful", "peer-stateful", "openvino (peer)",
     "peer: transformers.exporters OpenVINO, stateful, fp32 hint"),
    ("RESULTS_EXECUTORCH", "executorch", "static", "executorch",
     "hfexport ExecuTorch XNNPACK, static cache 256, multi-token decode"),
    ("RESULTS_EXECUTORCH", "peer-runner", "peer", "executorch (peer)",
     "peer: transformers.exporters ExecuTorch XNNPACK, same recipe (dynamic=True), its own runner"),
    ("RESULTS_AOTI", "static", "static", "aoti",
     "hfexport AOTInductor (.pt2 package, -march=native), static cache 256, multi-token decode"),
    ("RESULTS_AOTI", "dynamic", "dynamic", "aoti", "hfexport AOTInductor, dynamic cache (prefill + decode packages)"),
]
# optimum's exporters, checked with `pip install --dry-run -c constraints.txt <package>` (November 2026)
OPTIMUM = (
    "optimum-onnx and optimum-intel do not install beside our pins, so they have no row: every optimum-onnx release "
    "(newest 0.1.0) requires transformers < 4.58; optimum-intel 2.2.0 requires transformers < 5.6, and the only "
    "release pip can resolve with transformers 5.23 (1.15.0, no upper bound) imports `openvino.runtime`, which "
    "OpenVINO 2026 removed."
)


def _load(name: str) -> dict | None:
    path = HERE / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _mb(n: float | None) -> str:
    return "–" if n is None else f"{n / 1e6:.0f}"


def collect() -> dict[str, Any]:
    """Rows with the numbers each benchmark wrote, and the prefill report."""
    rows, loads = [], {}
    seen_backends: set[str] = set()
    prefill = _load("RESULTS_PREFILL") or {}
    for source, run, export, backend, label in ROWS:
        report = _load(source)
        data = (report or {}).get("smollm2")
        result = (data or {}).get("results", {}).get(run)
        if result is None:
            continue
        loads[source] = (report.get("load_start"), report.get("load_end"))
        exp = data.get("exports", {}).get(export, {})
        weights = exp.get("weight_bytes") or exp.get("model_weight_bytes")
        rss = exp.get("peak_rss") or (exp.get("peak_rss_mb", 0) * 2**20) or None
        row = {
            "source": source, "backend": backend, "label": label,
            "export_s": exp.get("export_s"), "peak_rss": rss, "bytes": exp.get("ir_bytes") or exp.get("bytes"),
            "weight_bytes": weights, "decode_tok_s": result.get("decode_tok_s"),
            "eager_tok_s": data["results"].get("eager", {}).get("decode_tok_s"),
            "same_tokens": result.get("same_tokens"),
        }
        if backend not in seen_backends:
            seen_backends.add(backend)
            pre = prefill.get("backends", {}).get(backend)
            if pre and "prefill_s" in pre:
                row["prefill_ms"] = pre["prefill_s"] * 1e3
                # eager timed in the backend's own rounds where the report has it (bench_prefill interleaves them)
                row["prefill_vs_eager"] = pre.get("eager_prefill_s", prefill["eager"]["prefill_s"]) / pre["prefill_s"]
                row["max_abs_diff"] = pre.get("max_abs_diff")
        rows.append(row)
    return {"rows": rows, "loads": loads, "prefill": prefill, "quantized": (_load("RESULTS_QUANTIZED") or {})}


def render(summary: dict, gbps: float, machine: str) -> str:
    rows = summary["rows"]
    weights = next((r["weight_bytes"] for r in rows if r["weight_bytes"]), None)
    bound = decode_bound(weights, gbps) if weights else None
    lines = [
        "# hfexport benchmarks: SmolLM2-135M, fp32, batch 1, greedy, CPU",
        "",
        f"Machine: {machine}. Written by `make bench` (`python benchmarks/run.py`), which runs every benchmark "
        "below one after the other; each one's own file (RESULTS_<BACKEND>.md) has every variant, the method, and "
        "the load average of its run.",
        "",
        f"**Roofline**: stream copy of a 1 GiB numpy array: {gbps:.1f} GB/s; the model's fp32 weights are "
        f"{_mb(weights)} MB, so a decode step that reads every weight once is bound to "
        + (f"**{bound:.0f} tok/s**." if bound else "(no weight bytes recorded)."),
        "",
        "Decode: 128 new tokens after a 19-token prompt, tokens/s over the tokens after the first; \"vs eager\" "
        "divides by eager `generate()` timed in the same benchmark run. Prefill: the 512-token prompt of "
        "`bench_prefill.py` (static cache 640), on each backend's recommended recipe (first row of the backend); "
        "parity: max abs diff of a plain export's logits on that prompt against eager's.",
        "",
        "| backend | recipe | export s | peak RSS MB | artifact MB (x weights) | decode tok/s | vs eager | "
        "of roofline | same tokens as eager | prefill 512 ms (vs eager) | parity |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    eagers = sorted({r["eager_tok_s"] for r in rows if r["eager_tok_s"]})
    if eagers:  # one eager figure per benchmark run: their range
        low, high = eagers[0], eagers[-1]
        pre = summary["prefill"].get("eager", {}).get("prefill_s")
        span = f"{low:.1f}" if high - low < 0.05 else f"{low:.1f}–{high:.1f}"
        share = "–" if not bound else (f"{low / bound:.0%}" if high - low < 0.05 else
                                       f"{low / bound:.0%}–{high / bound:.0%}")
        lines.append(f"| eager | `model.generate`, dynamic cache (range over the runs) | – | – | – | {span} | 1.00x | "
                     f"{share} | – | {f'{pre * 1e3:.0f}' if pre else '–'} | – |")
    for r in rows:
        tok = r["decode_tok_s"]
        size = "–" if not r["bytes"] else f"{_mb(r['bytes'])} ({r['bytes'] / r['weight_bytes']:.2f}x)"
        prefill = (f"{r['prefill_ms']:.0f} ({r['prefill_vs_eager']:.2f}x)" if "prefill_ms" in r else "–")
        parity = f"{r['max_abs_diff']:.1e}" if r.get("max_abs_diff") is not None else "–"
        lines.append(
            f"| {r['backend']} | {r['label']} | {r['export_s']:.1f} | {_mb(r['peak_rss'])} | {size} | {tok:.1f} | "
            f"{tok / r['eager_tok_s']:.2f}x | {f'{tok / bound:.0%}' if bound else '–'} | "
            f"{'yes' if r['same_tokens'] else '**NO**'} | {prefill} | {parity} |")
    quant = summary["quantized"].get("rows", [])
    if quant:
        lines += ["", "Quantized exports (`bench_quantized.py`, RESULTS_QUANTIZED.md): decode tok/s (– where no quiet "
                  "timing was taken), weight bytes against fp32, and greedy top-1 agreement with eager over 64 steps "
                  "on the prompts the recipes were tuned on and on held-out ones.", "",
                  "| recipe | format | bits | decode tok/s | vs fastest fp32 of its backend (same run) | weight ratio | "
                  "top-1 agreement (tuned / held-out) |",
                  "|---|---|---|---|---|---|---|"]

        def cell(value, form):
            return "–" if value is None else format(value, form)

        for q in quant:
            agreement = f"{cell(q.get('top1_agreement'), '.1%')} / {cell(q.get('top1_heldout'), '.1%')}"
            ratio = q.get("decode_vs_fp32")
            lines.append(f"| {q['recipe']} | {q['format']} | {q.get('bits', '–')} | {cell(q.get('decode_tok_s'), '.1f')} "
                         f"| {'–' if ratio is None else f'{ratio:.2f}x'} | {cell(q.get('weight_ratio'), '.3f')} | "
                         f"{agreement} |")
    lines += ["", OPTIMUM, ""]
    for source, (start, end) in summary["loads"].items():
        if start and end:
            lines.append(f"- {source}: load average at start {'/'.join(f'{v:.1f}' for v in start)}, at end "
                         f"{'/'.join(f'{v:.1f}' for v in end)}")
    return "\n".join(lines) + "\n"


def chart(summary: dict, gbps: float, path: Path) -> None:
    """A horizontal bar per row (decode tok/s), eager and the roofline as vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["rows"]
    weights = next((r["weight_bytes"] for r in rows if r["weight_bytes"]), None)
    # the timed quantized exports (bench_quantized's decode run), green: their tokens are not eager's by design
    quantized = [q for q in summary["quantized"].get("rows", []) if q.get("decode_tok_s") and q["recipe"] != "fp32"]
    fig, ax = plt.subplots(figsize=(10, 0.45 * (len(rows) + len(quantized)) + 1.6))
    labels = ([r["label"] for r in rows] + [f"{q['recipe']} {q['format']} ({q.get('bits', 8)}-bit)"
                                            for q in quantized])[::-1]
    values = ([r["decode_tok_s"] for r in rows] + [q["decode_tok_s"] for q in quantized])[::-1]
    colours = (["#d9534f" if not r["same_tokens"] else ("#999999" if "peer" in r["backend"] else "#2a7ab0")
                for r in rows] + ["#3c9d5d"] * len(quantized))[::-1]
    ax.barh(labels, values, color=colours)
    eagers = [r["eager_tok_s"] for r in rows if r["eager_tok_s"]]
    if eagers:
        ax.axvline(sum(eagers) / len(eagers), color="black", linestyle="--", label="eager generate() (mean of runs)")
    if weights:
        ax.axvline(decode_bound(weights, gbps), color="#e08e0b", label=f"fp32 roofline ({gbps:.0f} GB/s copy)")
    ax.set_xlabel("decode tokens/s, SmolLM2-135M, batch 1, CPU\n(blue: hfexport fp32; grey: peer; red: tokens differ "
                  "from eager's; green: quantized, timed in bench_quantized's own run)")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def machine_line() -> str:
    import platform

    cpu = platform.processor() or "unknown CPU"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    ram = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    return f"{cpu}, {os.cpu_count()} cores, {ram} GiB RAM, Python {platform.python_version()}"


def main(argv: list[str] | None = None) -> int:
    summary = collect()
    if not summary["rows"]:
        print("[summary] no benchmark results on disk (run `make bench`)", file=sys.stderr)
        return 1
    args = sys.argv[1:] if argv is None else argv
    if "--keep-bandwidth" in args:  # re-render on a busy machine: the bandwidth measured by the last quiet run
        gbps = json.loads((HERE / "RESULTS_SUMMARY.json").read_text())["copy_gbps"]
    else:
        gbps = memory_bandwidth()
    text = render(summary, gbps, machine_line())
    (HERE / "RESULTS.md").write_text(text)
    chart(summary, gbps, HERE / "RESULTS.png")
    (HERE / "RESULTS_SUMMARY.json").write_text(json.dumps({**summary, "copy_gbps": gbps}, indent=1, default=str))
    print(text)
    print("[summary] wrote benchmarks/RESULTS.md and benchmarks/RESULTS.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
