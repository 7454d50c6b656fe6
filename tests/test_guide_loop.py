"""The guide's own loop over ``decompose_for_generation`` runs as written, and every component takes its captured
kwargs.

The guide (``exporters-guide-fr.txt``, "Appel direct de decompose_for_generation"): decompose, run each component
eagerly as a sanity check, then export it with the same kwargs. The eager call (outside ``torch.no_grad``) leaves
autograd tensors in the cache it is given and grows or writes it; the export must still trace the captured cache.
Then: the exported component fed those kwargs gives eager's logits, and so does each component of
``export_for_generation`` (a static multi-token export serves the prefill with the decode graph, from the
capture's still-unallocated ``StaticCache``).
"""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from hfexport import DynamoConfig, OnnxConfig
from hfexport.exporter_dynamo import DynamoExporter
from hfexport.testing.tiny import TINY_CASES
from hfexport.utils import decompose_for_generation


def _inputs(case):
    return {k: v for k, v in case.inputs(2, 6).items() if not k.startswith("decoder")}


def _exporter(backend):
    if backend == "onnx":
        pytest.importorskip("onnxruntime", reason="the ONNX backend needs onnxruntime")
        from hfexport.exporter_onnx import OnnxExporter
        return OnnxExporter(), OnnxConfig(dynamic=True)
    return DynamoExporter(), DynamoConfig(dynamic=True)


def _cache_length(kwargs):
    cache = kwargs.get("past_key_values")
    return None if cache is None else int(cache.get_seq_length())


CASES = [("llama", "static", "dynamo"), ("t5", "dynamic", "dynamo"), ("llama", "static", "onnx")]


@pytest.mark.parametrize("family,cache,backend", CASES, ids=["-".join(c) for c in CASES])
def test_the_guides_loop_runs_as_written(family, cache, backend):
    case = TINY_CASES[family]
    model = case.build()
    gen = GenerationConfig(cache_implementation="static", max_cache_len=64) if cache == "static" else None
    components = decompose_for_generation(model, _inputs(case), generation_config=gen,
                                          multi_token_decode=cache == "static")
    exporter, config = _exporter(backend)
    exported = {}
    for name, (submodel, subinputs) in components.items():
        before = _cache_length(subinputs)
        eager_outputs = submodel(**subinputs)  # sanity-check the eager forward before exporting
        assert _cache_length(subinputs) == before, f"{name}: the eager call changed the captured cache"
        exported[name] = exporter.export(submodel, subinputs, config=config)
        got = exported[name].runner()(**subinputs)
        want = eager_outputs.logits if hasattr(eager_outputs, "logits") else eager_outputs.last_hidden_state
        have = got.logits if hasattr(got, "logits") else got.last_hidden_state
        assert (have - want.detach()).abs().max() <= 1e-4, name
    assert set(exported) == set(components)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_each_component_of_a_static_multi_token_export_takes_its_captured_kwargs(family):
    case = TINY_CASES[family]
    model = case.build()
    gen = GenerationConfig(cache_implementation="static", max_cache_len=64)
    components = decompose_for_generation(model, _inputs(case), generation_config=gen, multi_token_decode=True)
    exported = DynamoExporter().export_for_generation(model, _inputs(case), DynamoConfig(dynamic=True),
                                                      generation_config=gen, multi_token_decode=True)
    assert exported.components["prefill"] is exported.components["decode"]  # one graph serves both
    for name, (submodel, kwargs) in components.items():
        with torch.no_grad():
            want = submodel(**kwargs).logits
        got = exported.runner(name)(**kwargs).logits
        assert got.shape == want.shape and (got - want).abs().max() <= 1e-4, name
