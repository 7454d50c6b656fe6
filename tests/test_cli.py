"""The hfexport command: export a local model folder, with stages, timings and --json; env; errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hfexport import ExportedModel
from hfexport.cli import main


def _model_dir(tmp_path):
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, architectures=["LlamaForCausalLM"],
    )
    model = LlamaForCausalLM(config).eval()
    folder = tmp_path / "tiny-llama"
    model.save_pretrained(folder)
    return folder, model


def test_export_json_reports_stages_and_parity(tmp_path, capsys):
    folder, model = _model_dir(tmp_path)
    out = tmp_path / "out"
    assert main(["export", str(folder), "--format", "dynamo", "--output", str(out), "--dynamic", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["architecture"] == "LlamaForCausalLM"
    assert [s["stage"] for s in summary["stages"]] == ["load", "trace", "save", "check"]
    assert all(s["seconds"] >= 0 for s in summary["stages"])
    assert summary["max_abs_diff"] <= 1e-4
    assert (out / "export.json").is_file() and (out / "model.pt2").is_file()
    ids = torch.randint(0, 128, (1, 9))
    reloaded = ExportedModel.from_pretrained(out)
    with torch.no_grad():
        ref = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    got = reloaded(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
    assert (got - ref).abs().max() <= 1e-4


def test_export_prints_each_stage_to_stderr(tmp_path, capsys):
    folder, _ = _model_dir(tmp_path)
    assert main(["export", str(folder), "--output", str(tmp_path / "o")]) == 0
    captured = capsys.readouterr()
    for stage in ("[load]", "[trace]", "[save]"):
        assert stage in captured.err
    assert "max abs diff vs eager" in captured.out


def test_missing_model_folder_is_a_clear_error(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hfexport.cli", "export", str(tmp_path / "nope"), "--output", str(tmp_path / "o")],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode != 0
    assert "nope" in result.stderr
    assert "Traceback" not in result.stderr


def test_env_json_lists_backends(capsys):
    assert main(["env", "--json", "--workarounds"]) == 0
    text = capsys.readouterr().out
    assert "mamba-symbolic-scan" in text
