"""The hfexport command: export a local model folder, with stages, timings and --json; env; errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
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
    assert main(["export", str(folder), "--format", "dynamo", "--output", str(out), "--dynamic", "--json",
                 "--no-for-generation"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["architecture"] == "LlamaForCausalLM"
    # the exporter's own stages end inside "export", so they are listed before it
    graph = ["check", "prepare", "trace", "signature", "lower", "finish"]
    assert [s["stage"] for s in summary["stages"]] == ["load", *graph, "export", "save", "validate"]
    assert {s.get("component") for s in summary["stages"] if s["stage"] in graph} == {"model"}
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
    assert main(["export", str(folder), "--output", str(tmp_path / "o"), "--no-for-generation"]) == 0
    captured = capsys.readouterr()
    for stage in ("[load]", "[export]", "  [trace] model: ", "  [lower] model: ", "[save]", "[validate]"):
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


def test_a_generative_model_exports_for_generation_by_default_and_says_so(tmp_path, capsys):
    folder, model = _model_dir(tmp_path)
    out = tmp_path / "gen"
    assert main(["export", str(folder), "--output", str(out), "--static-cache", "32", "--multi-token", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["for_generation"] is True and summary["task"] == "text-generation"
    assert summary["same_tokens"] is True
    assert set(summary["components"]) == {"prefill", "decode"}
    stages = [s["stage"] for s in summary["stages"]]
    assert stages[:3] == ["load", "capture", "calibrate"] and stages[-2:] == ["save", "validate"]
    assert {s.get("component") for s in summary["stages"] if s["stage"] == "trace"} == {"decode"}
    reloaded = ExportedModel.from_pretrained(out)
    # the model's own generation config, with the cache settings merged in
    assert reloaded.generation_config.cache_implementation == "static"
    assert reloaded.generation_config.max_cache_len == 32
    assert reloaded.generation_config.eos_token_id == model.generation_config.eos_token_id
    _generates_like(reloaded, model)


def test_logits_to_keep_input_makes_the_positions_an_input_of_the_decode_graph(tmp_path, capsys):
    folder, model = _model_dir(tmp_path)
    out = tmp_path / "gen"
    assert main(["export", str(folder), "--output", str(out), "--static-cache", "32", "--multi-token",
                 "--logits-to-keep-input", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["same_tokens"] is True
    reloaded = ExportedModel.from_pretrained(out)
    spec = reloaded.components["decode"].metadata.kwargs["logits_to_keep"]
    assert spec.traced and spec.ndim == 1
    _generates_like(reloaded, model)


def _generates_like(exported, model):
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10,
                                  do_sample=False)
    assert torch.equal(exported.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=10),
                       expected)


def test_generation_is_announced_on_stderr(tmp_path, capsys):
    folder, _ = _model_dir(tmp_path)
    assert main(["export", str(folder), "--output", str(tmp_path / "o")]) == 0
    err = capsys.readouterr().err
    assert "[note] LlamaForCausalLM generates (text-generation): exporting its generation components" in err


@pytest.mark.parametrize("options,message", [
    (["--static-cache", "0"], "--static-cache must be a positive number"),
    (["--no-for-generation", "--multi-token"], "drop --no-for-generation"),
    (["--multi-token", "--no-dynamic"], "needs a dynamic query axis"),
    (["--logits-to-keep-input"], "is an input of the multi-token decode graph: add --multi-token"),
    (["--format", "openvino", "--ort-fusions", "cpu"], "--ort-fusions is an ONNX Runtime option"),
    (["--format", "dynamo", "--quantize", "ort-dynamic"], "cannot quantize a 'dynamo' export"),
])
def test_bad_options_are_refused_before_the_model_loads(tmp_path, capsys, monkeypatch, options, message):
    from hfexport.cli import loading

    monkeypatch.setattr(loading, "load_model_and_processor", lambda *a, **k: pytest.fail("the model was loaded"))
    folder, _ = _model_dir(tmp_path)
    assert main(["export", str(folder), "--output", str(tmp_path / "o"), *options]) == 2
    assert message in capsys.readouterr().err


def test_cuda_is_refused_on_a_machine_without_it(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the refusal is for machines without it")
    folder, _ = _model_dir(tmp_path)
    assert main(["export", str(folder), "--output", str(tmp_path / "o"), "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_the_task_is_detected_and_can_be_overridden(tmp_path, capsys):
    folder, model = _model_dir(tmp_path)
    out = tmp_path / "fe"
    assert main(["export", str(folder), "--output", str(out), "--task", "feature-extraction", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["task"] == "feature-extraction" and summary["for_generation"] is False
    assert summary["architecture"] == "LlamaModel" and summary["max_abs_diff"] <= 1e-4


def foreign_lines(stderr: str) -> list[str]:
    """Lines of ``stderr`` that hfexport did not write (its lines start with "[", "  [" or "exported ")."""
    ours = ("[", "  [", "exported ")
    return [line for line in stderr.splitlines() if line and not line.startswith(ours)]


def test_verbose_lets_the_libraries_speak(tmp_path):
    """-v keeps the libraries' own lines (the quiet default is checked on every backend's export in
    test_cli_e2e.test_export_then_run_gives_eager_text)."""
    folder, _ = _model_dir(tmp_path)
    verbose = subprocess.run(
        [sys.executable, "-m", "hfexport.cli", "-v", "export", str(folder), "--output", str(tmp_path / "v"),
         "--format", "dynamo"],  # (the quickest export: 14 s in a fresh process against 26 s for ONNX)
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert verbose.returncode == 0, verbose.stderr
    assert foreign_lines(verbose.stderr), verbose.stderr  # -v lets the libraries speak


def test_help_is_fast_and_loads_no_torch():
    import time

    code = ("import sys, time; t = time.perf_counter(); from hfexport.cli import build_parser; "
            "build_parser().format_help(); print(time.perf_counter() - t, 'torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    seconds, torch_loaded = result.stdout.split()
    assert torch_loaded == "False"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "hfexport.cli", "--help"], capture_output=True, check=True)
    assert time.perf_counter() - start < 1.5, "the whole process, interpreter start included"


def test_a_long_stage_shows_its_elapsed_time_while_it_runs(capsys):
    import time

    from hfexport.cli.progress import Progress
    from hfexport.stages import StageTiming

    progress = Progress()
    progress.SHOW_AFTER, progress.LOG_EVERY = 0.2, 0.6  # a log (not a tty): one line every LOG_EVERY
    with progress.stage("export", "tiny"):
        progress.started("decode", "lower")
        time.sleep(2.0)
        progress.record(StageTiming("decode", "lower", 2.0))
        time.sleep(0.1)  # a short stage shows nothing while it runs
    lines = capsys.readouterr().err.splitlines()
    running = [line for line in lines if "still running" in line]
    # the innermost running stage speaks; once it ends, the stage around it (running 2 s by then) may too
    assert running and running[0].startswith("  [lower] decode: still running, ")
    assert all(line.startswith(("  [lower] decode: still running, ", "[export]: still running, ")) for line in running)
    assert "  [lower] decode: 2.0s" in lines and lines[-1].startswith("[export] done in ")


def test_ort_fusions_reach_the_onnx_graph(tmp_path, capsys):
    import onnx

    folder, _ = _model_dir(tmp_path)
    domains = {}
    for name, extra in (("plain", []), ("fused", ["--ort-fusions", "cpu"])):
        out = tmp_path / name
        assert main(["export", str(folder), "--format", "onnx", "--output", str(out), "--static-cache", "32",
                     "--multi-token", "--json", *extra]) == 0
        assert json.loads(capsys.readouterr().out)["same_tokens"] is True
        graph = onnx.load(str(next(out.glob("*.onnx"))), load_external_data=False).graph
        domains[name] = {node.domain for node in graph.node}
    assert "com.microsoft" not in domains["plain"] and "com.microsoft" in domains["fused"]
