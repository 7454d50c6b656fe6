"""SmolLM2-135M (packaged, real weights): the exported model reloaded in a fresh process writes eager's text.

In the sweep (~60 s: a real-size export, then a second process that imports and loads it): the default suite has the
real weights' logits against eager after a reload (test_packaged_parity.py), a fresh process's ``hfexport run`` of a
saved export writing eager's text (test_cli_e2e.py), and ``make demo`` this model's generate.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from hfexport import DynamoConfig, DynamoExporter
from hfexport.testing.packaged import packaged

PROMPTS = ["The capital of France is", "def fibonacci(n):"]
NEW_TOKENS = 24


@pytest.mark.sweep
def test_smollm2_reloaded_in_a_new_process_generates_eager_text(tmp_path):
    model, tokenizer = packaged("smollm2")
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    sample = tokenizer(["Hello there, how are you?", "Hi"], padding=True, return_tensors="pt")
    exported = DynamoExporter().export_for_generation(model, dict(sample), DynamoConfig(dynamic=True))
    exported.save_pretrained(tmp_path / "export")
    expected = []
    for prompt in PROMPTS:
        inputs = tokenizer([prompt], return_tensors="pt")
        with torch.no_grad():
            ids = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
        expected.append(tokenizer.decode(ids[0], skip_special_tokens=True))

    script = textwrap.dedent(
        f"""
        import json, sys
        from hfexport import ExportedModel
        from hfexport.testing.packaged import packaged_dir
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(packaged_dir("smollm2"))
        exported = ExportedModel.from_pretrained({str(tmp_path / "export")!r})
        out = []
        for prompt in {PROMPTS!r}:
            ids = exported.generate(**tok([prompt], return_tensors="pt"), max_new_tokens={NEW_TOKENS}, do_sample=False)
            out.append(tok.decode(ids[0], skip_special_tokens=True))
        print(json.dumps(out))
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    got = json.loads(result.stdout.strip().splitlines()[-1])
    assert got == expected
    assert all(len(text) > len(prompt) + 20 for text, prompt in zip(got, PROMPTS))
