"""What the GPU paths need that a CPU machine can check (the paths themselves ran on an H200: benchmarks/cuda_check.py,
results in benchmarks/RESULTS_CUDA.md).

- a StaticCache prefill is traced before the cache's lazy initialisation, so its write counters are CPU tensors beside
  GPU keys and values: the metadata records that device, and generate()'s empty cache puts the counter there;
- the ExecuTorch CUDA backend's Triton SDPA takes bfloat16 only: other dtypes lower with AOTInductor's kernels;
- the CUDA backend's external data ("aoti_cuda_blob") is saved as the program's .ptd.
"""

from __future__ import annotations

import io

import pytest
import torch

from hfexport.metadata import ExportMetadata, IORole, TensorSpec


def test_an_input_traced_on_another_device_than_the_weights_is_recorded_and_read_back():
    spec = TensorSpec("past_key_values.layers.0.cumulative_length", IORole.CACHE_INPUT, "int64", [], device="cpu")
    assert TensorSpec.from_dict(spec.to_dict()).device == "cpu"
    plain = TensorSpec("input_ids", IORole.INPUT, "int64", [1, 7])
    assert "device" not in plain.to_dict() and TensorSpec.from_dict(plain.to_dict()).device is None


def test_the_trace_records_no_device_where_every_input_sits_with_the_weights():
    from hfexport import DynamoConfig
    from hfexport.exporter_dynamo import DynamoExporter
    from hfexport.testing.tiny import tiny_inputs, tiny_model

    exported = DynamoExporter().export(tiny_model("llama").eval(), tiny_inputs("llama"), DynamoConfig())
    assert [s.device for s in exported.components["model"].metadata.inputs] == [None, None]


def test_generates_empty_cache_keeps_a_cpu_traced_counter_on_the_cpu():
    from transformers import StaticCache

    from hfexport.pytrees import register_pytree_node
    from hfexport.generation.loop import Component as _Component

    register_pytree_node(StaticCache)
    from hfexport.metadata import CacheLeaf, LeafRole

    def place(role):
        return CacheLeaf("past_key_values", role, layer=0, layer_type="StaticLayer", static=True)

    leaves = [
        TensorSpec("past_key_values.layers.0.keys", IORole.CACHE_INPUT, "float32", [1, 2, 16, 8],
                   example_shape=[1, 2, 16, 8], cache=place(LeafRole.KEYS)),
        TensorSpec("past_key_values.layers.0.values", IORole.CACHE_INPUT, "float32", [1, 2, 16, 8],
                   example_shape=[1, 2, 16, 8], cache=place(LeafRole.VALUES)),
        TensorSpec("past_key_values.layers.0.cumulative_length", IORole.CACHE_INPUT, "int64", [], example_shape=[],
                   device="cpu", cache=place(LeafRole.COUNTER)),
    ]
    component = _Component.__new__(_Component)
    component.name = "prefill"
    component.metadata = ExportMetadata(kwargs={"past_key_values": {"kind": "cache", "type": "StaticCache"}},
                                        inputs=leaves)
    component.kwargs = component.metadata.kwargs
    spec = torch.utils._pytree.tree_structure(_static_cache())
    component.metadata.kwarg_specs = lambda: {"past_key_values": spec}
    cache = component.initial_cache(1, torch.device("meta"))  # "meta" stands for the GPU here
    layer = cache.layers[0]
    assert layer.keys.device.type == "meta" and layer.keys.shape == (1, 2, 16, 8)
    assert layer.cumulative_length.device.type == "cpu"


def _static_cache():
    from transformers import LlamaConfig, StaticCache

    config = LlamaConfig(hidden_size=16, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=1)
    cache = StaticCache(config=config, max_cache_len=16)
    cache.early_initialization(1, 2, 8, torch.float32, "cpu")
    return cache


def _cuda_specs(model):
    from hfexport.backends.executorch.targets import _cuda_compile_specs

    return {s.key: s.value for s in _cuda_compile_specs(model)}


def test_cuda_lowering_turns_the_bfloat16_only_triton_kernels_off_for_other_dtypes():
    assert _cuda_specs(torch.nn.Linear(4, 4)) == {"triton_kernel_mode": b"OFF"}
    assert _cuda_specs(torch.nn.Linear(4, 4).half()) == {"triton_kernel_mode": b"OFF"}
    assert _cuda_specs(torch.nn.Linear(4, 4).to(torch.bfloat16)) == {}


class _Cord:
    def __init__(self, payload: bytes):
        self.payload = payload

    def write_to_file(self, file: io.BufferedWriter) -> None:
        file.write(self.payload)


class _Manager:
    def __init__(self, data: dict):
        self._tensor_data = data


def test_the_cuda_backends_blob_is_saved_as_the_programs_ptd(tmp_path):
    from hfexport.backends.executorch.weights import write_data

    path = write_data(_Manager({"aoti_cuda_blob": _Cord(b"kernels and weights")}), tmp_path / "decode.pte")
    assert path == tmp_path / "decode.ptd" and path.read_bytes() == b"kernels and weights"
    with pytest.raises(RuntimeError, match=r"one external data file.*\['aoti_cuda_blob', 'weights'\]"):
        write_data(_Manager({"weights": _Cord(b""), "aoti_cuda_blob": _Cord(b"")}), tmp_path / "model.pte")
