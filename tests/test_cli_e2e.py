"""The command line a user runs, end to end as real processes: ``hfexport export`` (for generation, by default for a
model that generates) → ``hfexport run`` → the same text as eager ``model.generate``, on each backend; then
``hfexport validate`` on that export (exit 0) and against a model folder whose weights differ (exit 1, the leaf
named); ``hfexport bench --json`` on it.

The model is a tiny random Llama with SmolLM2's vocabulary and tokenizer, saved as a model folder with its tokenizer
(as a Hub repo is), so the export folder gets the tokenizer and its chat template from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from test_cli import foreign_lines
from test_run_cli import _tiny_llama

PROMPT = "The capital of France is"
NEW_TOKENS = 8
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def _hfexport(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hfexport.cli", *args], capture_output=True, text=True, env=ENV,
                          timeout=timeout)


@pytest.fixture(scope="module")
def model_dir(tokenizer, tmp_path_factory):
    model = _tiny_llama(tokenizer)
    folder = tmp_path_factory.mktemp("e2e") / "tiny-llama"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    ids = dict(tokenizer(PROMPT, return_tensors="pt"))
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    expected = tokenizer.decode(out[0, ids["input_ids"].shape[-1]:], skip_special_tokens=True)
    return folder, expected


# ExecuTorch (~50 s of lowering), AOTI (two compiles, ~60 s) and OpenVINO (24 s) run in the sweep: their exports and
# generation are in the default suite through their own tests (test_generate_executorch, test_aoti_backend,
# test_generate_openvino); this one adds the command line, which ONNX covers in the default suite (Dynamo: sweep)
_SWEEP = {"dynamo", "executorch", "aoti", "openvino"}  # (ONNX runs by default: the demo's path)


@pytest.mark.parametrize("backend", [pytest.param(b, marks=[pytest.mark.sweep] if b in _SWEEP else [])
                                     for b in ("dynamo", "onnx", "openvino", "executorch", "aoti")])
def test_export_then_run_gives_eager_text(model_dir, tmp_path, backend):
    folder, expected = model_dir
    out = tmp_path / backend
    exported = _hfexport("export", str(folder), "--format", backend, "--output", str(out), "--static-cache", "64",
                         "--multi-token", "--json")
    assert exported.returncode == 0, exported.stderr
    # quiet by default: no warnings, log lines, progress bars or C++ chatter of the libraries on stderr
    assert foreign_lines(exported.stderr) == [], exported.stderr
    for noise in ("Warning", "warn(", "torchao", "_pytree", "FutureWarning", "%|", "cpuinfo"):
        assert noise not in exported.stderr
    summary = json.loads(exported.stdout)
    assert summary["for_generation"] and summary["same_tokens"] and summary["passed"]
    assert (out / "tokenizer.json").is_file() and (out / "export.json").is_file()
    trust = ["--trust-remote-code"] if backend == "aoti" else []  # compiled code: loaded only when trusted
    ran = _hfexport("run", str(out), "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS), "--json", *trust)
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["text"] == expected


@pytest.mark.sweep  # (80 s of two CLI processes; tests/test_cli_validate.py keeps validate in the default suite)
def test_validate_passes_on_the_export_and_fails_on_other_weights(model_dir, tmp_path):
    from transformers import LlamaForCausalLM

    folder, _ = model_dir
    out = tmp_path / "onnx"
    assert _hfexport("export", str(folder), "--format", "onnx", "--output", str(out), "--static-cache", "64",
                     "--multi-token").returncode == 0
    good = _hfexport("validate", str(out), "--model", str(folder), "--json")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["passed"] is True
    bench = _hfexport("bench", str(out), "--eager", str(folder), "--new-tokens", "8", "--repeats", "1", "--json")
    assert bench.returncode == 0, bench.stderr
    timing = json.loads(bench.stdout)
    assert timing["decode_tok_s_best"] > 0 and timing["prefill_ms_best"] > 0 and timing["same_tokens"] is True
    changed = tmp_path / "changed"
    model = LlamaForCausalLM.from_pretrained(folder)
    with torch.no_grad():
        model.lm_head.weight[:, :8] += 0.5
    model.save_pretrained(changed)
    bad = _hfexport("validate", str(out), "--model", str(changed))
    assert bad.returncode == 1
    assert "logits" in bad.stdout + bad.stderr
