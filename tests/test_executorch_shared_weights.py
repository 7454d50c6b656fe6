"""An ExecuTorch export of two programs (prefill and decode over a dynamic cache) stores each weight once: both
``.pte`` load one ``model.ptd`` (:mod:`hfexport.backends.executorch.shared`), and the reloaded export generates
eager's tokens. The merge itself: every key once, each distinct buffer once, and no merge where two files give one
key different bytes.
"""

from __future__ import annotations

import pytest
import torch

from hfexport import ExecutorchConfig, ExportedModel
from hfexport.testing.tiny import TINY_CASES

pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")

NEW_TOKENS = 16


def _weight_bytes(model: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # a tied tensor is listed once


@pytest.mark.sweep  # 131 s of the default suite's 25-minute budget; the merge itself is checked below in milliseconds
def test_a_dynamic_cache_export_stores_each_weight_once_and_generates_like_eager(tmp_path):
    from hfexport.exporter_executorch import ExecutorchExporter

    case = TINY_CASES["llama"]
    model = case.build()
    assert model.lm_head.weight is not model.model.embed_tokens.weight  # untied: no .ptd before this change
    gen = model.generation_config
    gen.do_sample = False
    sample = {k: v for k, v in case.inputs(2, 6).items() if not k.startswith("decoder")}  # left-padded
    exported = ExecutorchExporter().export_for_generation(model, sample, ExecutorchConfig(dynamic=True),
                                                          generation_config=gen, multi_token_decode=False)
    assert exported.components["prefill"].program is not exported.components["decode"].program
    exported.save_pretrained(tmp_path)
    files = {p.name: p.stat().st_size for p in tmp_path.iterdir() if p.suffix in (".pte", ".ptd")}
    assert set(files) == {"prefill.pte", "decode.pte", "model.ptd"}, files
    weights = _weight_bytes(model)
    # every weight once (a second copy would double it; the .pte files hold the graphs only)
    assert weights <= files["model.ptd"] < 1.2 * weights, (files, weights)
    assert files["prefill.pte"] < weights / 4 and files["decode.pte"] < weights / 4, files  # graphs, no weights
    manifest = (tmp_path / "export.json").read_text()
    assert manifest.count('"model.ptd"') >= 2, manifest  # listed for both programs

    prompt = {k: v for k, v in case.inputs(2, 9).items() if not k.startswith("decoder")}
    with torch.no_grad():
        expected = model.generate(**prompt, generation_config=gen, max_new_tokens=NEW_TOKENS)
    reloaded = ExportedModel.from_pretrained(tmp_path)
    got = reloaded.generate(**prompt, max_new_tokens=NEW_TOKENS)
    assert torch.equal(got, expected), (got, expected)

    # saved again from the loaded export: still one shared file, the same bytes
    again = tmp_path / "again"
    reloaded.save_pretrained(again)
    assert sorted(p.name for p in again.iterdir() if p.suffix in (".pte", ".ptd")) == sorted(files)
    assert (again / "model.ptd").read_bytes() == (tmp_path / "model.ptd").read_bytes()


def _ptd(named: dict[str, bytes]) -> bytes:
    """A .ptd of raw named buffers, written by ExecuTorch's own serializer."""
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    buffers = list(named.values())
    entries = {k: DataEntry(buffer_index=i, alignment=16, tensor_layout=None) for i, k in enumerate(named)}
    return bytes(FlatTensorSerializer().serialize(DataPayload(buffers=buffers, named_data=entries)))


def _read(blob: bytes) -> dict[str, bytes]:
    from executorch.exir._serialize._cord import Cord
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    payload = FlatTensorSerializer().deserialize(Cord(blob))
    return {k: bytes(payload.buffers[e.buffer_index]) for k, e in payload.named_data.items()}, len(payload.buffers)


def test_the_merge_keeps_every_key_and_each_buffer_once():
    from hfexport.backends.executorch.shared import merge_data

    a, b, c = b"\x01" * 4096, b"\x02" * 4096, b"\x03" * 512
    merged = merge_data([_ptd({"w": a, "shared": b}), _ptd({"shared": b, "other_name": a, "x": c})])
    named, buffers = _read(bytes(merged))
    assert named == {"w": a, "shared": b, "other_name": a, "x": c}
    assert buffers == 3  # a is stored once for its two keys, b once for the key both files have


def test_two_files_giving_one_key_different_bytes_are_not_merged():
    from hfexport.backends.executorch.shared import merge_data

    assert merge_data([_ptd({"w": b"\x01" * 64}), _ptd({"w": b"\x02" * 64})]) is None
