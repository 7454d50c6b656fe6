"""examples/dynamo_decode_loop.py — the guide's Dynamo decode loop — reproduces eager greedy generation exactly.

The example runs as a user would run it (a subprocess, on the tiny seeded Llama). Its loop is the guide's code as
written, so a failure here means our export does not honour the guide's contract (the call signature of
``decode``, what ``torch.export.load`` needs, or the tokens), not that the example should be loosened.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "dynamo_decode_loop.py"
PROMPT_IDS = [1, 17, 42, 99, 7, 23, 64, 11, 5]  # the example's default prompt for the tiny Llama
MAX_CACHE_LEN = 64


def _run(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH")) if p)
    return subprocess.run(
        [sys.executable, str(EXAMPLE), *args], capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env
    )


def _generated(proc: subprocess.CompletedProcess) -> list[int]:
    assert proc.returncode == 0, f"example failed (rc={proc.returncode}):\n{proc.stderr[-6000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("generated ids: ")]
    assert lines, f"no 'generated ids:' line in the output:\n{proc.stdout}"
    return ast.literal_eval(lines[-1].removeprefix("generated ids: "))


def _eager(max_new_tokens: int) -> list[int]:
    """Eager greedy ``generate`` of the same tiny Llama, static cache of the same size, batch 1, no padding."""
    from transformers import GenerationConfig

    from hfexport.testing.tiny import TINY_CASES

    model = TINY_CASES["llama"].build()
    ids = torch.tensor([PROMPT_IDS])
    gen = GenerationConfig(
        cache_implementation="static",
        max_cache_len=MAX_CACHE_LEN,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=model.generation_config.eos_token_id,
        pad_token_id=model.generation_config.pad_token_id,
    )
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=gen)
    return out[0, len(PROMPT_IDS) :].tolist()


def _assert_same_as_eager(got: list[int], expected: list[int], max_new_tokens: int) -> None:
    # The guide's loop has no EOS stop: where eager stops early it must be on EOS, and the loop must agree up to it.
    if len(expected) < max_new_tokens:
        assert expected[-1] == 2, f"eager stopped after {len(expected)} tokens without EOS: {expected}"
        got = got[: len(expected)]
    assert len(got) == max_new_tokens or len(got) == len(expected), (len(got), max_new_tokens)
    assert got == expected, f"decode loop {got}\n        eager {expected}"


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    """Run the whole example once (export + loop in one process, the guide's loop up to a full cache)."""
    output = tmp_path_factory.mktemp("example") / "decode-export"
    proc = _run("--output", str(output), "--max-cache-len", str(MAX_CACHE_LEN))
    return output, proc


def test_example_writes_the_export(saved):
    output, proc = saved
    for name in ("decode.pt2", "export.json", "config.json", "generation_config.json"):
        assert (output / name).is_file(), f"{name} missing after the example's export; stderr:\n{proc.stderr[-3000:]}"
    # the multi-token decode over the static cache also serves the prefill: one program, the weights stored once
    assert not (output / "prefill.pt2").exists()
    manifest = json.loads((output / "export.json").read_text())
    assert {c["program"] for c in manifest["components"].values()} == {"decode.pt2"}


def test_example_loop_matches_eager_generate(saved):
    """The guide's loop runs to a full cache: max_cache_len - prompt_len + 1 tokens, all equal to eager's."""
    _, proc = saved
    max_new_tokens = MAX_CACHE_LEN - len(PROMPT_IDS) + 1
    _assert_same_as_eager(_generated(proc), _eager(max_new_tokens), max_new_tokens)


def test_example_loop_in_a_fresh_process(saved):
    """The loop alone, from the saved decode.pt2, in an interpreter that never exported or built a model: exactly
    the guide's imports (torch, StaticCache, register_pytree_node) must be enough for torch.export.load."""
    output, first = saved
    assert (output / "decode.pt2").is_file(), f"the export step failed:\n{first.stderr[-3000:]}"
    proc = _run("--skip-export", "--output", str(output), "--max-new-tokens", "20")
    _assert_same_as_eager(_generated(proc), _eager(20), 20)


def test_loading_decode_pt2_prints_no_traceback(saved):
    """torch.export.load of our decode.pt2 must not print a traceback (a '--- Logging error ---' from torch's
    weights_only fallback on the StaticCache inside example_inputs) on the user's terminal."""
    output, first = saved
    assert (output / "decode.pt2").is_file(), f"the export step failed:\n{first.stderr[-3000:]}"
    proc = _run("--skip-export", "--output", str(output), "--max-new-tokens", "2")
    _generated(proc)
    assert "Traceback" not in proc.stderr and "Logging error" not in proc.stderr, proc.stderr[-4000:]
