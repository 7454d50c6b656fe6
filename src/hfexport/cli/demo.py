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
import sys
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
# the weights once; the prompt's last position only through the head: --logits-to-keep-input), plus the backend's
# own options
_STATIC_CACHE_LEN = 256
_RECIPE_OPTIONS = {"onnx": {"ort_fusions": "cpu"}}
# OpenVINO keeps the model's growing cache instead, stateful (its one IR serves the prompt too): the CPU plugin fuses
# that cache into its stateful attention, not the static one
_GROWING_CACHE = ("openvino",)
_PROMPTS = ["The capital of France is", "Write a haiku about the sea."]


def _dir_bytes(path: Path, pattern: str = "*") -> int:
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file())


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
    # an AOTI package is compiled code: the demo trusts the one it has just built
    reloaded = ExportedModel.from_pretrained(out_dir, trust_remote_code=backend == "aoti")(**inputs)
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


def _command(argv: list[str]) -> tuple[int, dict[str, Any]]:
    """Run one ``hfexport`` command as a user would type it (its own process; its progress lines on our terminal);
    its exit status and ``--json`` output."""
    import subprocess

    stream = terminal()
    try:
        stream.fileno()
    except (AttributeError, OSError, ValueError):
        stream = None  # a captured stream (a test): the child's stderr is ours
    done = subprocess.run([sys.executable, "-m", "hfexport.cli", *argv, "--json"], stdout=subprocess.PIPE,
                          stderr=stream, text=True)
    text = done.stdout
    return done.returncode, json.loads(text[text.index("{"):]) if "{" in text else {}


def _generation_row(backend: str, model_dir: Path, workdir: Path) -> dict[str, Any]:
    """SmolLM2 for generation through the commands: ``export`` (its recipe), ``run``, ``validate``, and ``bench``
    against eager in the same run."""
    out_dir = workdir / f"smollm2-generate-{backend}"
    options = [f"--{k.replace('_', '-')}={v}" for k, v in _RECIPE_OPTIONS.get(backend, {}).items()]
    cache = [] if backend in _GROWING_CACHE else ["--static-cache", str(_STATIC_CACHE_LEN)]
    status, exported = _command(["export", str(model_dir), "--format", backend, "--output", str(out_dir),
                                 *cache, "--multi-token", "--logits-to-keep-input", *options])
    if status != 0 or not exported:
        return {"backend": backend, "failed": f"hfexport export exited {status}"}
    trust = ["--trust-remote-code"] if backend == "aoti" else []  # the package it has just compiled
    _, ran = _command(["run", str(out_dir), "--prompt", _PROMPTS[0], "--max-new-tokens", str(_GENERATE_TOKENS),
                       *trust])
    validated, report = _command(["validate", str(out_dir), "--model", str(model_dir), *trust])
    _, bench = _command(["bench", str(out_dir), "--eager", str(model_dir), "--new-tokens", str(_GENERATE_TOKENS),
                         "--repeats", "2", *trust])
    export_s = sum(s["seconds"] for s in exported["stages"] if s["stage"] in ("export", "save"))
    return {
        "backend": backend,
        "recipe": ("stateful growing cache" if backend in _GROWING_CACHE else f"static cache {_STATIC_CACHE_LEN}")
        + ", one multi-token decode graph (the prompt's last position through the head)"
        + "".join(f", {o}" for o in options),
        "export_s": round(export_s, 1),
        "size_mb": round(exported["bytes"] / 1e6, 1),
        "weights_mb": round(_dir_bytes(model_dir, "*.safetensors") / 1e6, 1),
        "tokens_per_s": round(bench.get("decode_tok_s_best") or float("nan"), 1),
        "eager_tokens_per_s": round((bench.get("eager") or {}).get("decode_tok_s_best") or float("nan"), 1),
        "same_text": bool(bench.get("same_tokens")) and validated == 0 and report.get("passed") is True,
        "text": ran.get("text", ""),
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
                from ..testing.packaged import packaged_dir

                for backend in backends:
                    cache = "" if backend in _GROWING_CACHE else f" --static-cache {_STATIC_CACHE_LEN}"
                    print(f"hfexport export {name} --format {backend}{cache} --multi-token --logits-to-keep-input, "
                          "then run, validate, "
                          "bench ...", file=terminal(), flush=True)
                    generation.append(_generation_row(backend, packaged_dir(name), Path(tmp)))
    if json_out:
        print(json.dumps({"forward": rows, "generate": generation}, indent=2))
    else:
        print(_table(rows))
        print()
        print(_generation_table(generation))
        for row in generation:
            print(f"\n[{row['backend']}] " + (f"{row['recipe']}: {row['text']!r}" if "failed" not in row
                                               else row["failed"]))
        if "executorch" not in backends:
            print("\nExecuTorch left out (a SmolLM2 export takes it 5-7 min here): hfexport demo --backends executorch")
        if "aoti" not in backends:
            print("AOTInductor left out (each SmolLM2 compile takes it ~3 min here): hfexport demo --backends aoti")
    ok = all(r["ok"] for r in rows) and all(r.get("same_text") for r in generation)
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
        if "failed" not in r else [r["backend"], "–", "–", "–", "–", "NO"]
        for r in rows
    ]
    return _render(header, body)


def _render(header: list[str], body: list[list[str]]) -> str:
    lines = [header, *body]
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)) for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)
