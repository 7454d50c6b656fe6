"""Shared fixtures: a tiny seeded Llama, its Dynamo export, and that export saved once per session.

Tests that change files on disk copy the saved export first (``saved_copy``), so the session copy stays pristine.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

TINY_LLAMA = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
)


def build_tiny_llama(seed: int = 0) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**TINY_LLAMA)).eval()


def tiny_inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 7), generator=generator)
    attention_mask = torch.ones(2, 7, dtype=torch.long)
    attention_mask[1, :2] = 0  # a left-padded row, so the mask matters
    return {"input_ids": input_ids, "attention_mask": attention_mask}


@dataclass
class TinyExport:
    model: torch.nn.Module
    inputs: dict[str, torch.Tensor]
    exported: Any  # hfexport.ExportedModel
    expected_logits: torch.Tensor  # eager logits on `inputs`


def _export(seed: int) -> TinyExport:
    import hfexport

    model = build_tiny_llama(seed)
    inputs = tiny_inputs()
    exported = hfexport.DynamoExporter().export(
        model, {k: v.clone() for k, v in inputs.items()}, config=hfexport.DynamoConfig(dynamic=True)
    )
    with torch.no_grad():
        expected = model(**inputs).logits
    return TinyExport(model, inputs, exported, expected)


@pytest.fixture(scope="session")
def tiny_export() -> TinyExport:
    """A tiny Llama (seed 0) exported with ``DynamoConfig(dynamic=True)``."""
    return _export(0)


@pytest.fixture(scope="session")
def tiny_export_b() -> TinyExport:
    """The same architecture with other weights (seed 1): a second export whose outputs differ."""
    return _export(1)


@pytest.fixture(scope="session")
def saved_export(tiny_export: TinyExport, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``tiny_export`` saved once; treat as read-only (use ``saved_copy`` to modify files)."""
    directory = tmp_path_factory.mktemp("saved") / "export"
    tiny_export.exported.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def saved_export_b(tiny_export_b: TinyExport, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("saved_b") / "export"
    tiny_export_b.exported.save_pretrained(directory)
    return directory


@pytest.fixture
def saved_copy(saved_export: Path, tmp_path: Path) -> Path:
    """A private copy of ``saved_export`` that a test may tamper with."""
    target = tmp_path / "export"
    shutil.copytree(saved_export, target)
    return target


@pytest.fixture(scope="session")
def make_tiny_llama():
    """``make_tiny_llama(seed)`` builds the tiny Llama of these fixtures (tests must not import conftest)."""
    return build_tiny_llama


@pytest.fixture(scope="session")
def tokenizer():
    """SmolLM2's tokenizer (and chat template), from the packaged model: what the CLI tests save beside an export."""
    from transformers import AutoTokenizer

    from hfexport.errors import MissingPackageError
    from hfexport.testing.packaged import packaged_dir

    try:
        folder = packaged_dir("smollm2")
    except MissingPackageError as e:  # the packaged model is an install-time dependency (make venv)
        pytest.skip(str(e))
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


@pytest.fixture
def without_workaround(monkeypatch):
    """``without_workaround(id)``: the registered workaround ``id`` does not apply for the rest of the test (a test's
    premise: what goes wrong without it)."""
    import dataclasses

    from hfexport.workarounds import registry

    def off(workaround_id: str) -> None:
        registry.workarounds()  # (the built-ins registered)
        replaced = dataclasses.replace(registry._registry[workaround_id], applies=lambda model, inputs: False)
        monkeypatch.setitem(registry._registry, workaround_id, replaced)

    return off
