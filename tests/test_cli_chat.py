"""``hfexport run DIR --chat``: a multi-turn conversation read from standard input, each reply streamed, equal to
eager ``model.generate`` on the same chat-templated conversation; generation flags passed through or refused by name.

The export is a tiny random Llama with SmolLM2's vocabulary and tokenizer (whose chat template adds a system
prompt), exported for generation with a static cache and multi-token decode, the tokenizer saved beside it.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
import torch
from test_run_cli import _export, _tiny_llama

from hfexport.cli.run import main
from hfexport.cli.timing import TextPrinter

CACHE = 96
TURNS = ["hello", "again"]


@pytest.fixture(scope="module")
def model(tokenizer):
    return _tiny_llama(tokenizer)


@pytest.fixture(scope="module")
def chat_dir(model, tokenizer, tmp_path_factory):
    from transformers import GenerationConfig

    folder = tmp_path_factory.mktemp("chat") / "tiny-static"
    gen = GenerationConfig(cache_implementation="static", max_cache_len=CACHE, do_sample=False,
                           eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    # a batch of two in the sample keeps the batch dimension dynamic, which beam search (--num-beams) needs
    _export(model, tokenizer, folder, generation_config=gen, multi_token_decode=True,
            prompts=("Hello, world!", "Hi"))
    return folder


def _eager_conversation(model, tokenizer, turns, max_new_tokens, **generation):
    """The replies of eager model.generate, turn by turn, each on the whole templated conversation so far."""
    messages, replies, token_ids = [], [], []
    for user in turns:
        messages.append({"role": "user", "content": user})
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = dict(tokenizer(text, return_tensors="pt", add_special_tokens=False))
        with torch.no_grad():
            out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False, **generation)
        new = out[0, ids["input_ids"].shape[-1]:].tolist()
        reply = tokenizer.decode(new, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": reply})
        replies.append(reply)
        token_ids.append(new)
    return replies, token_ids


def test_chat_through_stdin_streams_eager_replies(chat_dir, model, tokenizer):
    """The real process, two turns on standard input: stdout is each reply, on its own line, as eager's."""
    result = subprocess.run(
        [sys.executable, "-m", "hfexport.cli", "run", str(chat_dir), "--chat", "--max-new-tokens", "5"],
        input="hello\nagain\n", capture_output=True, text=True, timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    replies, _ = _eager_conversation(model, tokenizer, TURNS, 5)
    assert all(replies), replies  # random weights, but 5 tokens of SmolLM2's vocabulary decode to some text
    assert replies[0] != replies[1]  # the second turn saw the first: a different prompt, a different reply
    assert result.stdout == "".join(reply + "\n" for reply in replies)
    assert "[chat] 2 turn(s)" in result.stderr


def test_chat_json_keeps_the_conversation(chat_dir, model, tokenizer, capsys, monkeypatch):
    """--prompt is the first turn, stdin the next; an empty line ends the chat (the line after it is not read)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("again\n\nnever read\n"))
    assert main([str(chat_dir), "--chat", "--prompt", "hello", "--max-new-tokens", "6", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    replies, token_ids = _eager_conversation(model, tokenizer, TURNS, 6)
    assert [t["user"] for t in result["turns"]] == TURNS
    assert [t["token_ids"] for t in result["turns"]] == token_ids
    assert [t["text"] for t in result["turns"]] == replies
    assert [m["role"] for m in result["messages"]] == ["user", "assistant"] * 2
    assert [m["content"] for m in result["messages"][1::2]] == replies
    second = tokenizer.apply_chat_template(result["messages"][:3], add_generation_prompt=True, tokenize=False)
    assert result["turns"][1]["prompt_tokens"] == len(tokenizer(second, add_special_tokens=False)["input_ids"])
    assert all(t["decode_tokens_per_s"] > 0 and t["prefill_s"] > 0 for t in result["turns"])


def test_chat_with_beam_search_prints_each_reply(chat_dir, model, tokenizer, capsys, monkeypatch):
    """--num-beams reaches generate (beam search streams nothing: each reply is printed whole)."""
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\nagain\n"))
    assert main([str(chat_dir), "--chat", "--max-new-tokens", "6", "--num-beams", "3"]) == 0
    beams, _ = _eager_conversation(model, tokenizer, TURNS, 6, num_beams=3)
    greedy, _ = _eager_conversation(model, tokenizer, TURNS, 6)
    assert beams != greedy, "the test must tell beam search from greedy to show that --num-beams is passed"
    assert capsys.readouterr().out == "".join(reply + "\n" for reply in beams)


def test_chat_past_the_static_cache_names_the_turn(chat_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello\nagain\n"))
    assert main([str(chat_dir), "--chat", "--max-new-tokens", "40"]) == 2
    captured = capsys.readouterr()
    assert captured.out.count("\n") == 1  # the first reply was streamed before the second turn overflowed
    assert captured.err.startswith("hfexport: error: chat turn 2") and "max_cache_len" in captured.err


def test_chat_without_turns_generates_nothing(chat_dir, capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main([str(chat_dir), "--chat"]) == 0
    assert capsys.readouterr().out == ""


def test_prompt_is_required_without_chat(chat_dir, capsys):
    assert main([str(chat_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hfexport: error:") and "--prompt" in err and "--chat" in err


def test_a_flag_generate_does_not_honour_is_refused_by_name(chat_dir, capsys, monkeypatch):
    """The run command checks each generation flag against what ExportedModel.generate honours (every flag it
    has is honoured today: the check is exercised with a narrowed list)."""
    import hfexport.cli.run as run_cli

    monkeypatch.setattr(run_cli, "_accepted_generation_keys", lambda: ("max_new_tokens", "do_sample"))
    assert main([str(chat_dir), "--prompt", "hello", "--repetition-penalty", "1.3"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("hfexport: error:") and "--repetition-penalty" in captured.err
    assert "repetition_penalty" in captured.err and len(captured.err.strip().splitlines()) == 1


@pytest.mark.parametrize(("flag", "value", "key"), [("--repetition-penalty", 0.05, "repetition_penalty"),
                                                     ("--no-repeat-ngram-size", 1, "no_repeat_ngram_size")])
def test_penalty_flags_give_eager_replies_with_the_same_penalty(chat_dir, model, tokenizer, capsys, flag, value,
                                                                key):
    extra = {"repetition_penalty": 0.05} if key == "no_repeat_ngram_size" else {}
    baseline, _ = _eager_conversation(model, tokenizer, TURNS[:1], 12, **extra)
    expected, ids = _eager_conversation(model, tokenizer, TURNS[:1], 12, **extra, **{key: value})
    assert expected != baseline  # the flag changes eager's reply
    argv = [str(chat_dir), "--chat", "--max-new-tokens", "12", "--json", flag, str(value)]
    if extra:
        argv += ["--repetition-penalty", "0.05"]
    stdin = sys.stdin
    sys.stdin = io.StringIO(TURNS[0] + "\n")
    try:
        assert main(argv) == 0
    finally:
        sys.stdin = stdin
    result = json.loads(capsys.readouterr().out)
    assert [t["token_ids"] for t in result["turns"]] == ids


def test_a_generation_flag_reaches_generate_from_the_process(chat_dir, model, tokenizer):
    expected, _ = _eager_conversation(model, tokenizer, TURNS[:1], 12, repetition_penalty=0.05)
    result = subprocess.run(
        [sys.executable, "-m", "hfexport.cli", "run", str(chat_dir), "--chat", "--max-new-tokens", "12",
         "--repetition-penalty", "0.05"],
        input="hello\n", capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == expected[0] + "\n" and "Traceback" not in result.stderr


def test_min_new_tokens_passes_through(model, tokenizer, tmp_path, capsys, monkeypatch):
    """An export whose end-of-sequence is the first greedy token: its reply is that one token, unless
    --min-new-tokens holds the end back; then the tokens are eager's under the same min_new_tokens."""
    from transformers import GenerationConfig

    text = tokenizer.apply_chat_template([{"role": "user", "content": "hello"}], add_generation_prompt=True,
                                         tokenize=False)
    ids = dict(tokenizer(text, return_tensors="pt", add_special_tokens=False))
    with torch.no_grad():
        first = int(model(**ids).logits[0, -1].argmax())
    folder = tmp_path / "eos-first"
    gen = GenerationConfig(cache_implementation="static", max_cache_len=CACHE, do_sample=False, eos_token_id=first,
                           pad_token_id=tokenizer.pad_token_id)
    _export(model, tokenizer, folder, generation_config=gen, multi_token_decode=True)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))
    assert main([str(folder), "--chat", "--prompt", "hello", "--max-new-tokens", "6", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["turns"][0]["token_ids"] == [first]
    assert main([str(folder), "--chat", "--prompt", "hello", "--max-new-tokens", "6", "--min-new-tokens", "4",
                 "--json"]) == 0
    new = json.loads(capsys.readouterr().out)["turns"][0]["token_ids"]
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=6, min_new_tokens=4, do_sample=False, eos_token_id=first,
                             pad_token_id=tokenizer.pad_token_id)
    assert new == out[0, ids["input_ids"].shape[-1]:].tolist()
    assert len(new) >= 4 and first not in new[:4]


def test_text_printer_prints_exactly_the_decoded_reply(tokenizer):
    """Streamed piece by piece, across newlines and words split over tokens, the text is decode(tokens)."""
    text = "Hello there,\nthis is   a test: naïve café 😀 done"
    tokens = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    out = io.StringIO()
    printer = TextPrinter(tokenizer, out)
    printer.put(torch.tensor([[1, 2, 3]]))  # the prompt: skipped
    seen = []
    for token in tokens:
        printer.put(torch.tensor([token]))
        seen.append(out.getvalue())
    printer.end()
    assert out.getvalue() == tokenizer.decode(tokens, skip_special_tokens=True) + "\n"
    assert len(set(seen)) > 3, "printed while streaming, not only at the end"
    assert all(b.startswith(a) for a, b in zip(seen, seen[1:]))
