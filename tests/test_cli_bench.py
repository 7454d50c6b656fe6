"""``hfexport bench DIR``: load, prefill ms, decode tok/s, peak RSS; with ``--eager MODEL`` the same rounds on eager
``model.generate``, the speed-ups, and whether the greedy tokens are the same (and that this can say no).

``bench`` is called through :func:`hfexport.cli.bench.main` and through a parser built here with
``add_bench_parser``, as ``hfexport`` registers it.
"""

from __future__ import annotations

import argparse
import json
import shutil

import pytest
import torch
from test_run_cli import _export, _tiny_llama

from hfexport.cli.bench import add_bench_parser, main

PROMPT_LEN, NEW_TOKENS, REPEATS = 12, 6, 2


@pytest.fixture(scope="module")
def model(tokenizer):
    return _tiny_llama(tokenizer)


@pytest.fixture(scope="module")
def folders(model, tokenizer, tmp_path_factory):
    """(the export with its tokenizer, the eager model folder)."""
    from transformers import GenerationConfig

    root = tmp_path_factory.mktemp("bench")
    gen = GenerationConfig(cache_implementation="static", max_cache_len=64, do_sample=False,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    _export(model, tokenizer, root / "export", generation_config=gen, multi_token_decode=True)
    model.config.architectures = ["LlamaForCausalLM"]
    model.save_pretrained(root / "eager")
    tokenizer.save_pretrained(root / "eager")
    return root / "export", root / "eager"


def _bench_json(capsys, *argv: str) -> dict:
    assert main([*argv, "--json", "--prompt-len", str(PROMPT_LEN), "--new-tokens", str(NEW_TOKENS),
                 "--repeats", str(REPEATS)]) == 0
    return json.loads(capsys.readouterr().out)


def _check_side(row: dict) -> None:
    assert row["load_s"] > 0
    assert 0 < row["prefill_ms_best"] <= row["prefill_ms_median"]
    assert row["decode_tok_s_best"] >= row["decode_tok_s_median"] > 0


def test_bench_json_against_eager(folders, model, tokenizer, capsys):
    export, eager = folders
    report = _bench_json(capsys, str(export), "--eager", str(eager))
    assert report["format"] == "dynamo"
    assert (report["prompt_tokens"], report["new_tokens"], report["repeats"]) == (PROMPT_LEN, NEW_TOKENS, REPEATS)
    assert report["prompt_source"] == "tokenizer"
    _check_side(report)
    _check_side(report["eager"])
    assert report["eager"]["model"] == str(eager)
    for side in ("exported", "eager"):
        rounds = report["rounds"][side]
        assert len(rounds) == REPEATS
        assert all(r["decode_steps"] == NEW_TOKENS - 1 for r in rounds)  # every round generated all its tokens
        speeds = [r["decode_tokens_per_s"] for r in rounds]
        row = report["eager"] if side == "eager" else report
        assert row["decode_tok_s_best"] == max(speeds)
        assert min(speeds) <= row["decode_tok_s_median"] <= max(speeds)
        assert row["prefill_ms_best"] == pytest.approx(min(r["prefill_s"] for r in rounds) * 1e3)
    assert report["same_tokens"] is True
    assert report["decode_speedup"] == pytest.approx(
        report["decode_tok_s_median"] / report["eager"]["decode_tok_s_median"])
    assert report["prefill_speedup"] == pytest.approx(
        report["eager"]["prefill_ms_median"] / report["prefill_ms_median"])
    assert report["peak_rss_mb"] >= report["peak_rss_mb_before_eager"] > 50  # torch alone is more than 50 MB


def test_bench_says_when_the_tokens_differ(folders, tokenizer, tmp_path, capsys):
    """An eager model with other weights: same prompt, other greedy tokens, and the report says so."""
    export, _ = folders
    other = _tiny_llama(tokenizer)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    other.config.architectures = ["LlamaForCausalLM"]
    other.save_pretrained(tmp_path / "other")
    report = _bench_json(capsys, str(export), "--eager", str(tmp_path / "other"))
    assert report["same_tokens"] is False


def test_bench_without_a_tokenizer_uses_random_ids(folders, tmp_path, capsys):
    export, _ = folders
    bare = tmp_path / "bare"
    shutil.copytree(export, bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (bare / name).unlink(missing_ok=True)
    report = _bench_json(capsys, str(bare))
    assert report["prompt_source"] == "random" and report["prompt_tokens"] == PROMPT_LEN
    _check_side(report)
    assert report["eager"] is None and report["same_tokens"] is None and report["decode_speedup"] is None


def test_bench_table_through_a_registered_parser(folders, capsys):
    """As `hfexport bench` will be wired: add_bench_parser on the main parser's subparsers."""
    export, eager = folders
    parser = argparse.ArgumentParser(prog="hfexport")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", str(export), "--eager", str(eager), "--prompt-len", "8", "--new-tokens", "4",
                              "--repeats", "1"])
    assert args.command == "bench" and args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "prompt 8 tokens (tokenizer), 4 new tokens" in lines[0]
    assert [line.split()[0] for line in lines[2:4]] == ["exported", "eager"]
    assert float(lines[2].split()[-1]) > 0  # the export's median decode tok/s
    assert "same greedy tokens: yes" in lines[4]
    assert lines[5].startswith("peak RSS ") and "MB" in lines[5]


@pytest.mark.parametrize(("argv", "message"), [
    (["--new-tokens", "1"], "--new-tokens must be at least 2"),
    (["--prompt-len", "0", "--repeats", "0"],
     "--prompt-len must be at least 1, got 0; --repeats must be at least 1, got 0"),  # every problem at once
    (["--prompt-len", "60", "--new-tokens", "10"], "max_cache_len"),
])
def test_bench_errors_are_one_line(folders, capsys, argv, message):
    export, _ = folders
    assert main([str(export), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hfexport: error:") and message in err and len(err.strip().splitlines()) == 1


def test_bench_refuses_a_folder_that_is_not_a_generation_export(tmp_path, capsys):
    assert main([str(tmp_path / "missing")]) == 2
    assert "is not a folder" in capsys.readouterr().err
