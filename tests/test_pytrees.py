"""The one tree walker (``hfexport.pytrees``): a leaf's dotted name, and the tensor leaves in pytree order.

The expected names are written out: exports saved by earlier versions store them (``past_key_values.layers.0.keys``),
and ``get_leaf_tensors`` (the spec's ``hfexport.utils`` function) keys its result by them.
"""

from __future__ import annotations

import collections
import dataclasses

import pytest
import torch
import torch.utils._pytree as pytree
from transformers import DynamicCache, EncoderDecoderCache, LlamaConfig, LlamaForCausalLM, StaticCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from hfexport.pytrees import dump_spec, flatten_with_names, get_leaf_tensors, load_spec, tensor_leaves
from hfexport.utils import get_leaf_tensors as spec_get_leaf_tensors

LAYERS_01 = [
    "layers.0.keys", "layers.0.values", "layers.1.keys", "layers.1.values",
]


@dataclasses.dataclass
class Plain:
    """A dataclass that is no pytree node."""

    a: torch.Tensor
    b: list
    c: int = 3
    d: object = None


Pair = collections.namedtuple("Pair", "left right")


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64,
    )
    return LlamaForCausalLM(config).eval()


def _forward(model, cache):
    with torch.no_grad():
        return model(input_ids=torch.tensor([[1, 2, 3]]), past_key_values=cache, use_cache=True)


def test_spec_path_is_the_same_function():
    assert spec_get_leaf_tensors is get_leaf_tensors


def test_plain_containers_are_named_by_key_and_position():
    assert list(get_leaf_tensors({"a": torch.ones(1), "b": [torch.zeros(2)]}).keys()) == ["a", "b.0"]
    nested = {"a": [torch.ones(1), {"b": torch.zeros(1)}], "c": (torch.ones(2), [torch.ones(3), None, 4])}
    assert list(get_leaf_tensors(nested)) == ["a.0", "a.1.b", "c.0", "c.1.0"]
    assert list(get_leaf_tensors([torch.ones(1), [torch.ones(1), (torch.ones(1),)]])) == ["0", "1.0", "1.1.0"]
    assert list(get_leaf_tensors({0: torch.ones(1), 1: {2: torch.ones(1)}})) == ["0", "1.2"]
    assert list(get_leaf_tensors(torch.ones(2))) == [""]
    names, _ = flatten_with_names(nested)
    assert [n for n, _ in names] == ["a.0", "a.1.b", "c.0", "c.1.0", "c.1.1", "c.1.2"]


def test_model_output_with_a_dynamic_cache(llama):
    out = _forward(llama, DynamicCache(config=llama.config))
    assert isinstance(out, CausalLMOutputWithPast)
    leaves = get_leaf_tensors(out)
    assert list(leaves) == ["logits"] + [f"past_key_values.{n}" for n in LAYERS_01]
    assert leaves["logits"] is out.logits
    assert leaves["past_key_values.layers.1.values"] is out.past_key_values.layers[1].values
    assert list(get_leaf_tensors({"out": out, "x": torch.ones(1)})) == (
        ["out.logits"] + [f"out.past_key_values.{n}" for n in LAYERS_01] + ["x"]
    )
    names, _ = flatten_with_names({"past_key_values": out.past_key_values})
    assert [n for n, _ in names] == [f"past_key_values.{n}" for n in LAYERS_01]


def test_static_cache(llama):
    cache = StaticCache(config=llama.config, max_cache_len=8)
    _forward(llama, cache)
    expected = [
        "layers.0.keys", "layers.0.values", "layers.0.cumulative_length",
        "layers.1.keys", "layers.1.values", "layers.1.cumulative_length",
    ]
    assert list(get_leaf_tensors(cache)) == expected
    inputs = {"input_ids": torch.ones(1, 1, dtype=torch.long), "past_key_values": cache}
    assert list(get_leaf_tensors(inputs)) == ["input_ids"] + [f"past_key_values.{n}" for n in expected]
    names, spec = flatten_with_names(inputs)
    assert [n for n, _ in names] == ["input_ids"] + [f"past_key_values.{n}" for n in expected]
    assert load_spec(dump_spec(spec)) == spec


def test_encoder_decoder_cache(llama):
    cache = EncoderDecoderCache(
        _forward(llama, DynamicCache(config=llama.config)).past_key_values,
        _forward(llama, DynamicCache(config=llama.config)).past_key_values,
    )
    assert list(get_leaf_tensors({"past_key_values": cache})) == [
        f"past_key_values.{part}.{n}" for part in ("self_attention_cache", "cross_attention_cache") for n in LAYERS_01
    ]


def test_containers_that_are_no_pytree_node():
    plain = Plain(torch.ones(1), [torch.zeros(1), torch.zeros(2)])
    assert list(get_leaf_tensors(plain)) == ["a", "b.0", "b.1"]
    assert list(get_leaf_tensors([Plain(torch.ones(1), []), {"p": Plain(torch.ones(2), [torch.ones(1)])}])) == [
        "0.a", "1.p.a", "1.p.b.0"
    ]
    # a namedtuple: by position in get_leaf_tensors (as it always was); the pytree key path names its fields
    pair = {"p": Pair(torch.ones(1), torch.zeros(1))}
    assert list(get_leaf_tensors(pair)) == ["p.0", "p.1"]
    assert [n for n, _ in flatten_with_names(pair)[0]] == ["p.left", "p.right"]


def test_tensor_leaves_are_the_pytree_tensor_leaves(llama):
    from hfexport.pytrees.caches import register_cache_classes

    register_cache_classes()  # (pytree's own leaves need the caches registered, which an earlier test may not do)
    cache = StaticCache(config=llama.config, max_cache_len=8)
    _forward(llama, cache)
    tree = {"input_ids": torch.ones(1, 1), "use_cache": True, "mask": [None, torch.ones(3)], "past_key_values": cache}
    got = tensor_leaves(tree)
    want = [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]
    assert len(got) == len(want) == 2 + 6
    assert all(a is b for a, b in zip(got, want))
    assert got[0] is tree["input_ids"] and got[1] is tree["mask"][1] and got[2] is cache.layers[0].keys
    assert tensor_leaves(None) == [] and tensor_leaves(cache)[3] is cache.layers[1].keys
