"""The ONNX backend's contract: files on disk, I/O names, in-place static caches, fusions, errors.

Tiny Llama exports only (seconds each); module-scoped fixtures share them between tests.
"""

from __future__ import annotations

import collections
import json
import os

import numpy as np
import onnx
import pytest
import torch

from hfexport import ConfigError, ExportedModel, OnnxConfig, UnsupportedError
from hfexport.exporter_onnx import OnnxExporter
from backend_fixtures import CACHE_LEN, CASE, model, plain_fixture, static_config  # noqa: F401 (model: a fixture)

plain = plain_fixture(OnnxExporter, OnnxConfig(dynamic=True))


@pytest.fixture(scope="module")
def static_fused(model):
    """Static cache + multi-token decode from a batch of one, fused for the CPU: one GroupQueryAttention graph."""
    return OnnxExporter().export_for_generation(
        model, CASE.inputs(1, 6), OnnxConfig(dynamic=True, ort_fusions="cpu"), generation_config=static_config(model),
        multi_token_decode=True,
    )


@pytest.fixture(scope="module")
def static_plain(model, tmp_path_factory):
    exported = OnnxExporter().export_for_generation(
        model, CASE.inputs(1, 6), OnnxConfig(dynamic=True), generation_config=static_config(model),
        multi_token_decode=True,
    )
    directory = tmp_path_factory.mktemp("static") / "export"
    exported.save_pretrained(directory)
    return exported, directory


def _initializer_locations(path) -> list[tuple[str, int, bool]]:
    proto = onnx.load(str(path), load_external_data=False)
    out = []
    for tensor in proto.graph.initializer:
        external = tensor.data_location == onnx.TensorProto.EXTERNAL
        size = int(np.prod(tensor.dims)) * onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
        out.append((tensor.name, size, external))
    return out


# --- program and files ---------------------------------------------------------------------------------------------


def test_program_is_an_onnx_ir_model_with_the_newest_onnxscript_opset(plain):
    import onnx_ir as ir
    import onnxscript.onnx_opset as opsets

    newest = max(int(n[5:]) for n in dir(opsets) if n.startswith("opset") and n[5:].isdigit())
    assert isinstance(plain.program, ir.Model)
    assert plain.program.opset_imports[""] == newest


def test_opset_version_is_honoured(model):
    exported = OnnxExporter().export(model, CASE.inputs(2, 7), OnnxConfig(dynamic=True, opset_version=20))
    assert exported.program.opset_imports[""] == 20
    assert not [n for n in exported.program.graph if n.op_type == "Attention"]  # no Attention op before opset 23
    # unpadded: below opset 23 torchlib's SDPA gives rows whose every key is masked (the padding's own positions)
    # softmax's NaN-free uniform average, where torch returns zeros; the real tokens' values are the same
    inputs = CASE.inputs(3, 5, padded=False)
    with torch.no_grad():
        expected = model(**inputs).logits
    assert (exported(**inputs).logits - expected).abs().max() <= 1e-4


def test_save_writes_graph_and_external_data_and_lists_them(plain, tmp_path):
    directory = tmp_path / "export"
    plain.save_pretrained(directory)
    manifest = json.loads((directory / "export.json").read_text())
    files = manifest["components"]["model"]["files"]
    assert files == ["model.onnx", "model.onnx.data"] == OnnxExporter().program_files("model.onnx")
    assert {f["path"] for f in manifest["files"]} >= set(files)
    weights = sum(size for _, size, _ in _initializer_locations(directory / "model.onnx"))
    inline = [(name, size) for name, size, external in _initializer_locations(directory / "model.onnx")
              if not external and size > 256]
    assert not inline, f"weights stored in the protobuf: {inline}"
    assert (directory / "model.onnx.data").stat().st_size >= weights * 0.99


def test_loads_from_another_working_directory(plain, model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plain.save_pretrained("relative")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    reloaded = ExportedModel.from_pretrained(os.path.join("..", "relative"))
    monkeypatch.chdir("/")
    inputs = CASE.inputs(1, 5)
    with torch.no_grad():
        expected = model(**inputs).logits
    assert (reloaded(**inputs).logits - expected).abs().max() <= 1e-4


def test_prefill_and_decode_graphs_share_one_weights_file(model, tmp_path):
    exported = OnnxExporter().export_for_generation(model, CASE.inputs(2, 6), OnnxConfig(dynamic=True))
    assert exported.components["prefill"].program is not exported.components["decode"].program
    exported.save_pretrained(tmp_path)
    manifest = json.loads((tmp_path / "export.json").read_text())
    assert manifest["components"]["prefill"]["files"] == ["prefill.onnx", "weights.onnx.data"]
    assert manifest["components"]["decode"]["files"] == ["decode.onnx", "weights.onnx.data"]
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    data = (tmp_path / "weights.onnx.data").stat().st_size
    assert data < 1.1 * weights, (data, weights)  # stored once, not once per graph
    prompt = CASE.inputs(2, 9)
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(ExportedModel.from_pretrained(tmp_path).generate(**prompt, max_new_tokens=8), expected)


def test_static_multi_token_decode_serves_the_prefill_with_one_graph(static_plain):
    exported, directory = static_plain
    assert exported.components["prefill"] is exported.components["decode"]
    manifest = json.loads((directory / "export.json").read_text())
    assert {c["program"] for c in manifest["components"].values()} == {"decode.onnx"}
    reloaded = ExportedModel.from_pretrained(directory)
    assert reloaded.components["prefill"].program is reloaded.components["decode"].program
    assert reloaded.runner("prefill").session is reloaded.runner("decode").session  # weights loaded once


# --- names and in-place caches -------------------------------------------------------------------------------------


def test_cache_tensors_are_input_output_pairs_named_from_the_signature(static_plain):
    from hfexport.backends.onnx.names import io_names

    exported, _ = static_plain
    metadata = exported.components["decode"].metadata
    graph = exported.components["decode"].program.graph
    inputs, outputs = io_names(metadata)
    assert [v.name for v in graph.inputs] == inputs and [v.name for v in graph.outputs] == outputs
    cache_in = {n[len("input."):] for n in inputs if n.startswith("input.")}
    cache_out = {n[len("output."):] for n in outputs if n.startswith("output.")}
    assert cache_in == cache_out and "past_key_values.layers.0.keys" in cache_in
    assert {"input_ids", "attention_mask", "position_ids"} <= set(inputs) and "logits" in outputs


def _empty_static_cache(model, max_cache_len=CACHE_LEN):
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    cache.early_initialization(1, model.config.num_key_value_heads, model.config.head_dim, torch.float32, "cpu")
    return cache


def _prompt_kwargs(length):
    positions = torch.arange(length)
    mask = (torch.arange(CACHE_LEN)[None, :] <= positions[:, None])[None, None]
    return dict(input_ids=CASE.inputs(1, length)["input_ids"], attention_mask=mask, position_ids=positions[None])


def test_static_cache_is_updated_in_its_own_buffers(static_plain, model):
    exported, _ = static_plain
    runner = exported.runner("decode")
    assert "output.past_key_values.layers.0.keys" in runner.in_place_outputs
    # the per-layer position counters are read after the graph writes them: copied back, not bound
    assert "output.past_key_values.layers.0.cumulative_length" in runner.copied_back_outputs
    kwargs = _prompt_kwargs(5)
    eager_cache, cache = _empty_static_cache(model), _empty_static_cache(model)
    with torch.no_grad():
        expected = model(**kwargs, past_key_values=eager_cache)
    pointers = [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers]
    out = runner(**kwargs, past_key_values=cache)
    assert out.past_key_values is cache  # the caller's cache object, updated, as eager and Dynamo do
    assert [(layer.keys.data_ptr(), layer.values.data_ptr()) for layer in cache.layers] == pointers
    assert (out.logits - expected.logits).abs().max() <= 1e-4
    for mine, theirs in zip(cache.layers, eager_cache.layers):
        assert (mine.keys - theirs.keys).abs().max() <= 1e-5 and (mine.values - theirs.values).abs().max() <= 1e-5
        assert int(mine.cumulative_length) == int(theirs.cumulative_length) == 5


def test_in_place_false_leaves_the_callers_cache_untouched(static_plain, model):
    _, directory = static_plain
    runner = ExportedModel.from_pretrained(directory, in_place=False).runner("decode")
    assert runner.in_place_outputs == [] and runner.copied_back_outputs == []
    cache = _empty_static_cache(model)
    out = runner(**_prompt_kwargs(4), past_key_values=cache)
    assert out.past_key_values is not cache
    assert all(layer.keys.abs().sum() == 0 and int(layer.cumulative_length) == 0 for layer in cache.layers)
    assert all(layer.keys.abs().sum() > 0 and int(layer.cumulative_length) == 4 for layer in out.past_key_values.layers)


def test_the_specs_onnx_runtime_decode_loop_runs_on_cpu(static_plain, model):
    """The guide's ONNX Runtime loop as written, on the CPU provider: ORT's own CudaSession io-binding helper binds
    torch CPU tensors just as well (device "cpu" instead of "cuda")."""
    import onnxruntime as ort
    from onnxruntime.transformers.io_binding_helper import CudaSession, TypeHelper

    _, directory = static_plain
    device = torch.device("cpu")
    max_cache_len = CACHE_LEN
    prompt_ids = CASE.inputs(1, 7)["input_ids"]
    prompt_len = prompt_ids.shape[-1]

    def causal_mask(positions, cache_len):
        return (torch.arange(cache_len, device=device)[None, :] <= positions[:, None])[None, None]

    session = ort.InferenceSession(str(directory / "decode.onnx"), providers=["CPUExecutionProvider"])
    cuda = CudaSession(session, device)

    cache = {}
    for i in session.get_inputs():
        if not i.name.startswith("input."):
            continue
        name = i.name[len("input.") :]
        dims = [max_cache_len if isinstance(d, str) and not d.isdigit() else int(d) for d in i.shape]
        cache[name] = torch.zeros(dims, dtype=TypeHelper.ort_type_to_torch_type(i.type), device=device)
        cuda.set_buffer_sharing(f"input.{name}", f"output.{name}")
    cache_feed = {f"input.{name}": buf for name, buf in cache.items()}

    vocab_size = next(o.shape[-1] for o in session.get_outputs() if o.name.endswith("logits"))

    # prefill: the whole prompt in one call
    positions = torch.arange(prompt_len, device=device)
    cuda.allocate_buffers({"logits": (1, prompt_len, vocab_size)})
    out = cuda.infer({"input_ids": prompt_ids, "attention_mask": causal_mask(positions, max_cache_len),
                      "position_ids": positions[None], **cache_feed})
    next_token = out["logits"][:, -1:].argmax(-1)
    tokens = [int(next_token)]

    # decode: query=1 buffers reused in place
    cuda.allocate_buffers({"logits": (1, 1, vocab_size)})
    input_ids = torch.empty((1, 1), dtype=torch.long, device=device)
    position_ids = torch.empty((1, 1), dtype=torch.long, device=device)
    attention_mask = torch.empty((1, 1, 1, max_cache_len), dtype=torch.bool, device=device)
    slots = torch.arange(max_cache_len, device=device)
    for position in range(prompt_len, prompt_len + 15):
        input_ids.copy_(next_token)
        position_ids.fill_(position)
        attention_mask[0, 0, 0].copy_(slots <= position)
        out = cuda.infer({"input_ids": input_ids, "attention_mask": attention_mask,
                          "position_ids": position_ids, **cache_feed})
        next_token = out["logits"][:, -1:].argmax(-1)
        tokens.append(int(next_token))

    assert vocab_size == model.config.vocab_size
    with torch.no_grad():
        expected = model.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=16,
                                  do_sample=False, eos_token_id=None)
    assert tokens == expected[0, prompt_len:].tolist()
    # the K/V and the position counters were updated in the caller's buffers, with no copy out
    assert int(cache["past_key_values.layers.0.cumulative_length"]) == prompt_len + 15
    assert cache["past_key_values.layers.1.keys"][0, :, prompt_len + 14].abs().sum() > 0


# --- fusions ---------------------------------------------------------------------------------------------------------


def test_fused_llama_graph_contains_onnx_runtime_contrib_ops(static_fused):
    graph = static_fused.components["decode"].program.graph
    contrib = collections.Counter(n.op_type for n in graph if n.domain == "com.microsoft")
    layers = 2
    assert contrib["GroupQueryAttention"] == layers  # attention over the cache, cache updated by the op
    assert contrib["RotaryEmbedding"] == 2 * layers  # queries and keys
    assert contrib["SkipSimplifiedLayerNormalization"] == 2 * layers  # residual add + RMSNorm
    ops = collections.Counter(n.op_type for n in graph)
    assert ops["SimplifiedLayerNormalization"] == 1  # the first norm (no residual yet)
    assert ops["Attention"] == 0 and ops["ScatterND"] == 0 and ops["Softmax"] == 0
    # packed projections: q/k/v and gate/up become one MatMul each (+ o_proj, down_proj per layer, lm_head)
    assert ops["MatMul"] + contrib["FusedMatMul"] == 4 * layers + 1
    counts = json.loads(static_fused.components["decode"].program.metadata_props["hfexport.ort_fusions"])
    assert counts["target"] == "cpu" and counts["attention"] == layers and counts["packed_matmul"] == 3 * layers


def test_fused_static_cache_is_written_in_place_by_group_query_attention(static_fused, model):
    runner = static_fused.runner("decode")
    assert {f"output.past_key_values.layers.{i}.{kv}" for i in range(2) for kv in ("keys", "values")} <= set(
        runner.in_place_outputs
    )
    prompt = CASE.inputs(1, 9)
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=24, do_sample=False, eos_token_id=None)
    assert torch.equal(static_fused.generate(**prompt, max_new_tokens=24, eos_token_id=None), expected)


def test_ort_fusions_need_the_optimiser():
    with pytest.raises(ConfigError, match="ort_fusions: needs optimize=True"):
        OnnxConfig(ort_fusions="cpu", optimize=False)
    with pytest.raises(ConfigError, match="ort_fusions"):
        OnnxConfig(ort_fusions="tensorrt")


def test_optimize_false_skips_the_optimiser_and_still_matches(model, plain):
    raw = OnnxExporter().export(model, CASE.inputs(2, 7), OnnxConfig(dynamic=True, optimize=False))
    assert len(raw.program.graph) > len(plain.program.graph)
    inputs = CASE.inputs(3, 6)
    with torch.no_grad():
        expected = model(**inputs).logits
    assert (raw(**inputs).logits - expected).abs().max() <= 1e-4


# --- errors and options ----------------------------------------------------------------------------------------------


def test_unknown_runner_options_are_refused(plain):
    with pytest.raises(TypeError, match="providers, session_options and in_place"):
        plain.to(None, provider="CPUExecutionProvider")


def test_runner_takes_providers_and_session_options(plain):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    plain.to("cpu", providers=["CPUExecutionProvider"], session_options=options)
    runner = plain.runner()
    assert runner.session.get_providers() == ["CPUExecutionProvider"]
    assert runner.session.get_session_options().intra_op_num_threads == 1
    plain.to(None)


def test_a_cuda_device_without_the_gpu_build_names_the_pip_line(plain):
    """ONNX Runtime only warns for a provider it lacks and falls back to the CPU; the runner refuses at once."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has the CUDA provider (onnxruntime-gpu): the refusal cannot happen here")
    with pytest.raises(UnsupportedError, match=r"CUDAExecutionProvider.*pip install 'onnxruntime-gpu=="):
        plain.to("cuda")
    with pytest.raises(UnsupportedError, match="names no CUDA provider"):
        plain.to("cuda", providers=["CPUExecutionProvider"])
    plain.to(None)


def test_a_graph_that_does_not_match_its_metadata_is_refused(plain, model):
    other = OnnxExporter().export(model, CASE.inputs(2, 7) | {"position_ids": torch.arange(7)[None].repeat(2, 1)},
                                  OnnxConfig(dynamic=True))
    from hfexport.backends.onnx.runner import OnnxRunner

    with pytest.raises(UnsupportedError, match="do not match its export metadata"):
        OnnxRunner(other.program, plain.components["model"].metadata)


def test_workarounds_that_fired_are_recorded(plain):
    fired = plain.components["model"].metadata.workarounds
    assert "onnx-view-as-reshape" in fired and "onnx-sdpa-symbolic-heads" in fired
    assert "onnx-sdpa-gqa" in fired  # tiny Llama has 2 K/V heads for 4 query heads
    keys = [n.inputs[1] for n in plain.program.graph if n.op_type == "Attention"]
    assert keys and all(k.shape[1] == 2 for k in keys), "repeat_kv should not copy the cache to 4 heads"
