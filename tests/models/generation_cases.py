"""Shared pieces of the per-backend generation tests: inputs without decoder prompts, and the cache configs."""

from __future__ import annotations

import copy


def text_inputs(case, batch, seq):
    """Generate kwargs of a tiny case: its inputs without ``decoder_*`` (generate() starts the decoder itself)."""
    return {k: v for k, v in case.inputs(batch, seq).items() if not k.startswith("decoder")}


def generation_config(model, cache):
    """Greedy generation config of ``model``; ``cache="static"`` gives a 64-position static cache."""
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample = False
    if cache == "static":
        gen.cache_implementation = "static"
        gen.max_cache_len = 64
    return gen


def exporter_for(backend, dynamic=True):
    """``(exporter, config)`` for a backend name (skips, naming the package, where its runtime is not installed)."""
    import pytest

    if backend == "dynamo":
        from hfexport import DynamoConfig
        from hfexport.exporter_dynamo import DynamoExporter
        return DynamoExporter(), DynamoConfig(dynamic=dynamic)
    package = {"onnx": "onnxruntime", "openvino": "openvino", "executorch": "executorch"}[backend]
    pytest.importorskip(package, reason=f"the {backend} backend needs the {package} package")
    if backend == "onnx":
        from hfexport import OnnxConfig
        from hfexport.exporter_onnx import OnnxExporter
        return OnnxExporter(), OnnxConfig(dynamic=dynamic)
    if backend == "openvino":
        from hfexport import OpenVINOConfig
        from hfexport.exporter_openvino import OpenVINOExporter
        return OpenVINOExporter(), OpenVINOConfig(dynamic=dynamic)
    from hfexport import ExecutorchConfig
    from hfexport.exporter_executorch import ExecutorchExporter
    return ExecutorchExporter(), ExecutorchConfig(dynamic=dynamic)


def assert_greedy_equals_eager(model, exported, case, gen, new_tokens, batch=2, seq=9):
    """``exported.generate`` on a left-padded batch of ``case``'s inputs gives eager ``model.generate``'s tokens
    (``gen``: the generation config both run with). Returns the prompt and eager's tokens."""
    import torch

    prompt = text_inputs(case, batch, seq)
    eager_gen = copy.deepcopy(gen)
    eager_gen.max_new_tokens = new_tokens
    with torch.no_grad():
        expected = model.generate(**prompt, generation_config=eager_gen)
    got = exported.generate(**prompt, max_new_tokens=new_tokens)
    assert got.shape == expected.shape and torch.equal(got, expected), (got, expected)
    return prompt, expected
