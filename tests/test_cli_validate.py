"""``hfexport validate DIR --model MODEL``: exit 0 on a good export, 1 naming the leaf when a weight differs, 2 when
the export or the model cannot be loaded; ``--json`` is one object.

The subcommand is registered on a parser built here with :func:`add_validate_parser` (as ``hfexport.cli`` does),
and run the way :func:`hfexport.cli.main` runs a subcommand: its return value is the exit status, an
``HfExportError`` is status 2.
"""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hfexport import DynamoConfig, DynamoExporter
from hfexport.cli.loading import sample_inputs
from hfexport.cli.validate import add_validate_parser
from hfexport.errors import HfExportError


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hfexport")
    add_validate_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["validate", *argv])
    try:
        return args.func(args)
    except HfExportError as e:
        print(f"hfexport: error: {e}")
        return 2


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, architectures=["LlamaForCausalLM"], pad_token_id=0,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The model folder, a copy of it with one weight moved by +0.5, and a Dynamo export of the first."""
    root = tmp_path_factory.mktemp("validate")
    model = _tiny_llama()
    model.save_pretrained(root / "model")
    with torch.no_grad():
        changed = _tiny_llama()
        changed.model.layers[0].mlp.down_proj.weight[0, 0] += 0.5
    changed.save_pretrained(root / "changed")
    inputs = sample_inputs(model, None)
    DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True)).save_pretrained(root / "export")
    with torch.no_grad():
        moved = float((changed(**inputs).logits - model(**inputs).logits).abs().max())
    assert moved > 1e-2  # the changed folder's eager logits differ from the export's source
    return root


def test_a_good_export_exits_0(folders, capsys):
    assert _run([str(folders / "export"), "--model", str(folders / "model")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("validation passed (dynamo): 5 of 5 output leaves within tolerance")


def test_json_is_one_object_with_every_leaf(folders, capsys):
    assert _run([str(folders / "export"), "--model", str(folders / "model"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is True and report["problems"] == [] and report["generation"] is None
    assert report["directory"] == str(folders / "export") and report["model"] == str(folders / "model")
    assert report["leaves"]["logits"]["max_abs_diff"] <= 1e-4 and report["leaves"]["logits"]["atol"] == 1e-4
    assert len(report["leaves"]) == 5


def test_a_changed_weight_exits_1_and_names_the_leaf(folders, capsys):
    assert _run([str(folders / "export"), "--model", str(folders / "changed")]) == 1
    out = capsys.readouterr().out
    assert out.startswith("validation FAILED (dynamo)")
    assert "\n  logits: max abs diff" in out
    assert _run([str(folders / "export"), "--model", str(folders / "changed"), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["passed"] is False and report["leaves"]["logits"]["passed"] is False


def test_atol_loosens_the_bar(folders, capsys):
    assert _run([str(folders / "export"), "--model", str(folders / "changed"), "--atol", "10", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["leaves"]["logits"]["atol"] == 10.0


def test_load_errors_exit_2(folders, tmp_path, capsys):
    assert _run([str(tmp_path / "missing"), "--model", str(folders / "model")]) == 2
    assert "missing" in capsys.readouterr().out
    assert _run([str(folders / "export"), "--model", str(tmp_path / "no-model")]) == 2
    out = capsys.readouterr().out
    assert "cannot load the model" in out and "no-model" in out
    assert _run([str(folders / "export"), "--model", str(folders / "model"), "--max-new-tokens", "0"]) == 2


def test_generation_export(folders, tmp_path, capsys):
    from transformers import GenerationConfig

    model = _tiny_llama()
    gen = GenerationConfig(cache_implementation="static", max_cache_len=40, do_sample=False, pad_token_id=0)
    exported = DynamoExporter().export_for_generation(model, sample_inputs(model, None), DynamoConfig(dynamic=True),
                                                      generation_config=gen, multi_token_decode=True)
    exported.save_pretrained(tmp_path / "gen")
    assert _run([str(tmp_path / "gen"), "--model", str(folders / "model"), "--max-new-tokens", "12", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["generation"]["max_new_tokens"] == 12 and report["generation"]["first_difference"] == [None, None]
    assert report["generation"]["eager_tokens"] == report["generation"]["exported_tokens"]
    assert _run([str(tmp_path / "gen"), "--model", str(folders / "changed"), "--max-new-tokens", "12"]) == 1
    out = capsys.readouterr().out
    assert "prefill.logits: max abs diff" in out and "first differing token at new position" in out
