"""I/O roles as typed data: each traced kwarg's kind and each cache tensor's place in its cache are written at trace
time, saved, checked on load, and read by generation and the runners without looking at any leaf's name."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from hfexport import DynamoConfig, ExportedModel
from hfexport.exporter_dynamo import DynamoExporter
from hfexport.generation.loop import Component
from hfexport.metadata import CacheLeaf, ExportMetadata, KwargKind, KwargSpec, LeafRole, TensorSpec
from hfexport.testing.tiny import TINY_CASES



def text_inputs(case, batch, seq):
    """Generate kwargs of a tiny case: without ``decoder_*`` (generate() starts the decoder itself)."""
    return {k: v for k, v in case.inputs(batch, seq).items() if not k.startswith("decoder")}


def generation_config(model, cache):
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample = False
    gen.cache_implementation = cache
    gen.max_cache_len = 64
    return gen


@pytest.fixture(scope="module")
def llama_static():
    case = TINY_CASES["llama"]
    model = case.build()
    exported = DynamoExporter().export_for_generation(
        model, text_inputs(case, 2, 6), DynamoConfig(dynamic=True), generation_config=generation_config(model, "static"),
        multi_token_decode=True)
    return case, model, exported


@pytest.fixture(scope="module")
def t5_static():
    case = TINY_CASES["t5"]
    model = case.build()
    exported = DynamoExporter().export_for_generation(
        model, text_inputs(case, 2, 12), DynamoConfig(dynamic=True), generation_config=generation_config(model, "static"))
    return case, model, exported


def test_each_kwarg_is_recorded_with_its_kind(llama_static):
    _, _, exported = llama_static
    md = exported.components["decode"].metadata
    assert md.kind_of("input_ids") is KwargKind.TENSOR and md.kwargs["input_ids"].ndim == 2
    assert md.kind_of("past_key_values") is KwargKind.CACHE and md.cache_type == "StaticCache"
    assert md.cache_kwarg == "past_key_values"
    assert md.kind_of("use_cache") is KwargKind.FLAG and not md.kwargs["use_cache"].traced
    assert md.kind_of("pixel_values") is None
    # the spec's field stays a dict of dicts, saved as plain JSON
    assert md.kwargs["past_key_values"] == {"kind": "cache", "type": "StaticCache"}


def test_every_cache_tensor_has_its_layer_and_role(llama_static):
    case, model, exported = llama_static
    md = exported.components["decode"].metadata
    layers = model.config.num_hidden_layers
    leaves = md.cache_leaves()
    assert [(s.cache.layer, s.cache.role) for s in leaves] == [
        (i, role) for i in range(layers) for role in (LeafRole.KEYS, LeafRole.VALUES, LeafRole.COUNTER)]
    assert all(s.cache.static and s.cache.layer_type == "StaticLayer" and s.cache.part is None for s in leaves)
    assert all(s.cache is None for s in md.inputs if s.name in ("input_ids", "position_ids"))
    assert len(md.cache_leaves(LeafRole.COUNTER)) == layers


def test_an_encoder_decoder_cache_names_its_parts(t5_static):
    _, model, exported = t5_static
    md = exported.components["decode"].metadata
    assert md.cache_type == "EncoderDecoderCache"
    selfs = md.cache_leaves(LeafRole.KEYS, part="self_attention_cache")
    cross = md.cache_leaves(LeafRole.KEYS, part="cross_attention_cache")
    assert [s.cache.layer for s in selfs] == [s.cache.layer for s in cross] == list(range(model.config.num_layers))
    assert all(s.cache.static for s in selfs + cross)
    assert {s.example_shape[-2] for s in cross} == {12}  # the encoder length the capture was traced with


def _renamed(md: ExportMetadata) -> ExportMetadata:
    """The same metadata with every cache tensor renamed: no name says what the tensor holds any more."""
    md = copy.deepcopy(md)
    for i, spec in enumerate(md.cache_leaves()):
        spec.name = f"cache_tensor_{i}"
    return md


def test_generation_reads_the_roles_not_the_names(llama_static, t5_static):
    _, model, exported = llama_static

    class Fake:  # what Component reads from an ExportedModel
        def __init__(self, exported, md):
            self.components = {"decode": dataclasses.replace(exported.components["decode"], metadata=md)}

        def runner(self, name):
            return None

    md = exported.components["decode"].metadata
    real = Component(Fake(exported, md), "decode")
    renamed = Component(Fake(exported, _renamed(md)), "decode")
    assert renamed.cache_capacity() == real.cache_capacity() == 64
    a, b = real.initial_cache(2), renamed.initial_cache(2)
    for la, lb in zip(a.layers, b.layers):
        assert la.keys.shape == lb.keys.shape and la.keys.shape[0] == 2
        assert la.cumulative_length.shape == lb.cumulative_length.shape == torch.Size([])  # no batch axis

    _, t5, exported_t5 = t5_static
    md = exported_t5.components["decode"].metadata
    assert Component(Fake(exported_t5, _renamed(md)), "decode").cache_capacity() == 64


def test_generation_matches_eager_with_the_recorded_roles(llama_static, t5_static):
    for case, model, exported in (llama_static, t5_static):
        prompt = text_inputs(case, 2, 9)
        gen = generation_config(model, "static")
        gen.max_new_tokens = 12
        with torch.no_grad():
            expected = model.generate(**prompt, generation_config=gen)
        assert torch.equal(exported.generate(**prompt, max_new_tokens=12), expected)


def test_roles_survive_save_and_load(llama_static, tmp_path):
    _, _, exported = llama_static
    exported.save_pretrained(tmp_path / "out")
    loaded = ExportedModel.from_pretrained(tmp_path / "out")
    before = exported.components["decode"].metadata
    after = loaded.components["decode"].metadata
    assert [s.cache for s in after.inputs] == [s.cache for s in before.inputs]
    assert after.kwargs == before.kwargs and isinstance(after.kwargs["past_key_values"], KwargSpec)


@pytest.mark.parametrize("field,value,message", [
    ("role", "rotary", "cache.role"),
    ("layer", -1, "cache.layer"),
    ("kwarg", 3, "cache.kwarg"),
])
def test_a_bad_cache_place_is_refused_naming_the_field(field, value, message):
    spec = TensorSpec("c", "cache_input", "float32", [1, 2], cache=CacheLeaf("past_key_values", LeafRole.KEYS, 0))
    saved = spec.to_dict()
    saved["cache"][field] = value
    with pytest.raises(ValueError, match=message):
        TensorSpec.from_dict(saved)


def test_a_bad_kwarg_kind_is_refused():
    with pytest.raises(ValueError, match="kwargs.x.kind"):
        ExportMetadata.from_dict({"kwargs": {"x": {"kind": "banana"}}})
