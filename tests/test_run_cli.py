"""``hfexport run DIR --prompt ...``: the text it prints is eager ``model.generate``'s, decoded; errors are clear.

The export is a tiny random Llama whose vocabulary is SmolLM2's (49152 ids, hidden 64), saved with SmolLM2's
tokenizer beside it, so real text goes in and out offline in seconds.
"""

from __future__ import annotations

import io
import json
import shutil
import sys

import pytest
import torch

from hfexport.cli.run import main
from hfexport.generation.streamers import TimingStreamer

PROMPT = "The capital of France is"
NEW_TOKENS = 12


def _tiny_llama(tokenizer) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.do_sample = False
    return model


def _export(model, tokenizer, folder, generation_config=None, multi_token_decode=False,
            prompts=("Hello, world!",)) -> None:
    """Export for generation on ``prompts`` (two or more keep the batch dimension dynamic, as beam search needs)."""
    from hfexport import DynamoConfig, DynamoExporter

    sample = dict(tokenizer(list(prompts), return_tensors="pt", padding=len(prompts) > 1, padding_side="left"))
    exported = DynamoExporter().export_for_generation(
        model, sample, DynamoConfig(dynamic=True), generation_config=generation_config,
        multi_token_decode=multi_token_decode,
    )
    exported.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.fixture(scope="module")
def model(tokenizer):
    return _tiny_llama(tokenizer)


@pytest.fixture(scope="module")
def export_dir(model, tokenizer, tmp_path_factory):
    folder = tmp_path_factory.mktemp("run") / "tiny-smollm-vocab"
    _export(model, tokenizer, folder)
    return folder


def _eager_text(model, tokenizer, prompt_ids: dict, max_new_tokens: int = NEW_TOKENS) -> tuple[str, list[int]]:
    with torch.no_grad():
        out = model.generate(**prompt_ids, max_new_tokens=max_new_tokens, do_sample=False)
    new = out[0, prompt_ids["input_ids"].shape[-1] :].tolist()
    return tokenizer.decode(new, skip_special_tokens=True), new


def test_run_prints_eager_text_and_speed(export_dir, model, tokenizer, capsys):
    assert main(["run", str(export_dir), "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS)]) == 0
    captured = capsys.readouterr()
    expected, _ = _eager_text(model, tokenizer, dict(tokenizer(PROMPT, return_tensors="pt")))
    assert captured.out == expected + "\n"
    assert "tok/s" in captured.err and "prefill" in captured.err, captured.err


def test_run_json(export_dir, model, tokenizer, capsys):
    assert main([str(export_dir), "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    expected, new = _eager_text(model, tokenizer, dict(tokenizer(PROMPT, return_tensors="pt")))
    assert result["token_ids"] == new
    assert result["text"] == expected
    assert result["prompt_tokens"] == len(tokenizer(PROMPT)["input_ids"])
    assert result["new_tokens"] == len(new)
    assert result["decode_steps"] == len(new) - 1
    assert result["prefill_s"] > 0 and result["load_s"] > 0
    assert result["decode_tokens_per_s"] > 0


def test_run_chat_applies_the_template(export_dir, model, tokenizer, capsys, monkeypatch):
    assert tokenizer.chat_template, "SmolLM2-Instruct's tokenizer carries a chat template"
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # --prompt is the only turn (tests/test_cli_chat.py: more)
    assert main([str(export_dir), "--prompt", "Hi", "--chat", "--max-new-tokens", "6", "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)["turns"]
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                         tokenize=False)
    ids = dict(tokenizer(text, return_tensors="pt", add_special_tokens=False))
    expected, new = _eager_text(model, tokenizer, ids, 6)
    assert result["prompt_tokens"] == ids["input_ids"].shape[-1]
    assert (result["token_ids"], result["text"]) == (new, expected)


def test_run_static_cache_multi_token_export(model, tokenizer, tmp_path, capsys):
    from transformers import GenerationConfig

    folder = tmp_path / "static"
    gen = GenerationConfig(cache_implementation="static", max_cache_len=32, do_sample=False,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    _export(model, tokenizer, folder, generation_config=gen, multi_token_decode=True)
    assert main([str(folder), "--prompt", PROMPT, "--max-new-tokens", str(NEW_TOKENS), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    expected, new = _eager_text(model, tokenizer, dict(tokenizer(PROMPT, return_tensors="pt")))
    assert (result["token_ids"], result["text"]) == (new, expected)
    # more than the static cache holds: a clear error, not a traceback
    assert main([str(folder), "--prompt", PROMPT, "--max-new-tokens", "40"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hfexport: error:") and "max_cache_len" in err, err


def test_no_tokenizer_is_a_clear_error(export_dir, tmp_path, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(export_dir, bare)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        (bare / name).unlink(missing_ok=True)
    assert main([str(bare), "--prompt", PROMPT]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("hfexport: error:") and "no tokenizer" in captured.err
    assert "save_pretrained" in captured.err and "Traceback" not in captured.err


def test_not_a_folder_and_not_an_export(tmp_path, tokenizer, capsys):
    assert main([str(tmp_path / "missing"), "--prompt", PROMPT]) == 2
    assert "is not a folder" in capsys.readouterr().err
    tokenizer.save_pretrained(tmp_path / "tok-only")  # a tokenizer but no export.json
    assert main([str(tmp_path / "tok-only"), "--prompt", PROMPT]) == 2
    assert capsys.readouterr().err.startswith("hfexport: error:")


def test_chat_without_template_is_a_clear_error(export_dir, tmp_path, capsys):
    folder = tmp_path / "no-template"
    shutil.copytree(export_dir, folder)
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert main([str(folder), "--prompt", PROMPT, "--chat"]) == 2
    assert "no chat template" in capsys.readouterr().err


def test_timing_streamer_splits_prefill_and_decode():
    timer = TimingStreamer(start=0.0)
    timer.put(torch.tensor([[1, 2, 3]]))  # the prompt: not a token
    timer.token_times = [1.0, 1.5, 2.0, 2.5]  # first token after 1 s, then three steps of 0.5 s
    stats = timer.stats()
    assert stats == {"prefill_s": 1.0, "decode_steps": 3, "decode_s": 1.5, "decode_tokens_per_s": 2.0}


def test_cli_registers_run():
    """`hfexport run` is wired into the main command (one line in cli.build_parser: add_run_parser(sub))."""
    from hfexport.cli import build_parser

    args = build_parser().parse_args(["run", "some-dir", "--prompt", "hi"])
    assert args.command == "run" and args.prompt == "hi"
