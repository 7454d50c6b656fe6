"""``hfexport demo``: export the packaged real models and show, per backend, what it cost and how close it is.

Two tables. Forward parity (SmolLM2 and MiniLM): export seconds, artifact size, max abs diff of the outputs against
eager PyTorch (within the backend's fp32 bound), before and after ``save_pretrained`` -> ``from_pretrained``.
Generation (SmolLM2, each backend's fastest recipe): export seconds, artifact size, decode tokens/s of
``ExportedModel.generate`` against eager ``model.generate``, same text or not.

ExecuTorch is left out unless asked for (``hfexport demo --backends executorch``): one SmolLM2 export takes it
5-7 minutes on 2 cores, against seconds to a minute for the others.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from .quiet import terminal

import torch

from ..validation import FP32_ATOL

__all__ = ["run_demo", "DEMO_BACKENDS"]

DEMO_BACKENDS = ("dynamo", "onnx", "openvino")
# fp32 parity bound per backend: OpenVINO's and XNNPACK's kernels reassociate sums (DESIGN, "Numbers")
TOLERANCE = FP32_ATOL  # the one fp32 tolerance table
# the generation recipe per backend: a static cache whose multi-token decode graph also runs the prefill (one graph,
# the weights once), plus the backend's own options
_STATIC_CACHE_LEN = 256
_RECIPE_OPTIONS = {"onnx": {"ort_fusions": "cpu"}}
_PROMPTS = ["The capital of France is", "Write a haiku about the sea."]


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _row(name: str, backend: str, model: torch.nn.Module, inputs: dict[str, Any], workdir: Path) -> dict[str, Any]:
    from ..registry import AutoExportConfig
    from ..exported import ExportedModel
    from ..registry import AutoHfExporter
    from ..validation import compare_outputs

    config = AutoExportConfig.from_dict({"export_format": backend, "dynamic": True})
    start = time.perf_counter()
    exported = AutoHfExporter.from_config(config).export(model, inputs, config=config)
    export_seconds = time.perf_counter() - start
    out_dir = workdir / f"{name}-{backend}"
    exported.save_pretrained(out_dir)
    with torch.no_grad():
        eager = model(**inputs)
    got = exported(**inputs)  # the first call creates the runtime's session: not a forward's time
    times = []
    for _ in range(5):
        start = time.perf_counter()
        exported(**inputs)
        times.append(time.perf_counter() - start)
    run_ms = sorted(times)[len(times) // 2] * 1e3  # steady state: the median of 5 calls after the first
    reloaded = ExportedModel.from_pretrained(out_dir)(**inputs)
    report = compare_outputs(got, eager)
    reload_report = compare_outputs(reloaded, eager)
    return {
        "model": name,
        "backend": backend,
        "export_s": round(export_seconds, 1),
        "size_mb": round(_dir_bytes(out_dir) / 1e6, 1),
        "forward_ms": round(run_ms, 1),
        "max_abs_diff": report["max_abs_diff"],
        "reloaded_max_abs_diff": reload_report["max_abs_diff"],
        "ok": max(report["max_abs_diff"], reload_report["max_abs_diff"]) <= TOLERANCE.get(backend, 1e-4)
        and not report["problems"],
    }


def _generation_row(backend: str, model: torch.nn.Module, tokenizer: Any, workdir: Path) -> dict[str, Any]:
    from ..registry import AutoExportConfig
    from ..exported import ExportedModel
    from ..registry import AutoHfExporter

    import copy

    from ..generation.streamers import TimingStreamer

    config = AutoExportConfig.from_dict({"export_format": backend, "dynamic": True, **_RECIPE_OPTIONS.get(backend, {})})
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample, gen.cache_implementation, gen.max_cache_len = False, "static", _STATIC_CACHE_LEN
    sample = tokenizer([_PROMPTS[0]], return_tensors="pt")  # the static cache fixes the batch: one prompt at a time
    start = time.perf_counter()
    exported = AutoHfExporter.from_config(config).export_for_generation(
        model, dict(sample), config, generation_config=gen, multi_token_decode=True
    )
    export_seconds = time.perf_counter() - start
    out_dir = workdir / f"smollm2-generate-{backend}"
    exported.save_pretrained(out_dir)
    exported = ExportedModel.from_pretrained(out_dir)
    prompt = tokenizer([_PROMPTS[0]], return_tensors="pt")
    new = _GENERATE_TOKENS
    eager_timer, ours_timer = TimingStreamer(), TimingStreamer()
    with torch.no_grad():
        eager_ids = model.generate(**prompt, max_new_tokens=new, do_sample=False, streamer=eager_timer)
    ids = exported.generate(**prompt, max_new_tokens=new, do_sample=False, streamer=ours_timer)
    text = tokenizer.decode(ids[0], skip_special_tokens=True)
    return {
        "backend": backend,
        "recipe": f"static cache {_STATIC_CACHE_LEN}, one multi-token decode graph"
        + "".join(f", {k}={v!r}" for k, v in _RECIPE_OPTIONS.get(backend, {}).items()),
        "export_s": round(export_seconds, 1),
        "size_mb": round(_dir_bytes(out_dir) / 1e6, 1),
        "weights_mb": round(sum({p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}.values())
                            / 1e6, 1),
        "tokens_per_s": round(ours_timer.stats()["decode_tokens_per_s"] or float("nan"), 1),
        "eager_tokens_per_s": round(eager_timer.stats()["decode_tokens_per_s"] or float("nan"), 1),
        "same_text": text == tokenizer.decode(eager_ids[0], skip_special_tokens=True),
        "text": text,
    }


_GENERATE_TOKENS = 64


def run_demo(json_out: bool = False, backends: list[str] | None = None) -> int:
    """Run the demo; returns the process exit code (0 when every row matches eager within 1e-4)."""
    from ..testing.packaged import packaged

    from .env import environment_report

    usable = {name for name, b in environment_report()["backends"].items() if b["usable"]}
    backends = list(backends or DEMO_BACKENDS)
    for backend in [b for b in backends if b not in usable]:
        print(f"skipping {backend}: not usable here (see `hfexport env`)", file=terminal())
    backends = [b for b in backends if b in usable]
    rows: list[dict[str, Any]] = []
    generation: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="hfexport-demo-") as tmp:
        for name in ("smollm2", "minilm"):
            print(f"loading {name} ...", file=terminal(), flush=True)
            model, tokenizer = packaged(name)
            if tokenizer.pad_token is None:
                tokenizer.pad_token = tokenizer.eos_token
            encoded = tokenizer(_PROMPTS, padding=True, return_tensors="pt")
            inputs = {k: v for k, v in encoded.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            for backend in backends:
                print(f"exporting {name} to {backend} ...", file=terminal(), flush=True)
                rows.append(_row(name, backend, model, inputs, Path(tmp)))
            if name == "smollm2":
                for backend in backends:
                    print(f"exporting {name} for generation to {backend} ...", file=terminal(), flush=True)
                    generation.append(_generation_row(backend, model, tokenizer, Path(tmp)))
    if json_out:
        print(json.dumps({"forward": rows, "generate": generation}, indent=2))
    else:
        print(_table(rows))
        print()
        print(_generation_table(generation))
        for row in generation:
            print(f"\n[{row['backend']}] {row['recipe']}: {row['text']!r}")
        if "executorch" not in backends:
            print("\nExecuTorch left out (a SmolLM2 export takes it 5-7 min here): hfexport demo --backends executorch")
    ok = all(r["ok"] for r in rows) and all(r["same_text"] for r in generation)
    return 0 if ok else 1


def _table(rows: list[dict[str, Any]]) -> str:
    header = ["model", "backend", "export s", "size MB", "forward ms", "max|diff|", "reloaded", "ok"]
    body = [
        [
            r["model"],
            r["backend"],
            f"{r['export_s']:.1f}",
            f"{r['size_mb']:.1f}",
            f"{r['forward_ms']:.1f}",
            f"{r['max_abs_diff']:.1e}",
            f"{r['reloaded_max_abs_diff']:.1e}",
            "yes" if r["ok"] else "NO",
        ]
        for r in rows
    ]
    return _render(header, body)


def _generation_table(rows: list[dict[str, Any]]) -> str:
    header = ["SmolLM2 generate", "export s", "size MB (x weights)", "decode tok/s", "eager tok/s", "same text"]
    body = [
        [r["backend"], f"{r['export_s']:.1f}", f"{r['size_mb']:.1f} ({r['size_mb'] / r['weights_mb']:.2f}x)",
         f"{r['tokens_per_s']:.1f}", f"{r['eager_tokens_per_s']:.1f}", "yes" if r["same_text"] else "NO"]
        for r in rows
    ]
    return _render(header, body)


def _render(header: list[str], body: list[list[str]]) -> str:
    lines = [header, *body]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)
