"""The ExecuTorch backend's contract: backend selection and its errors, the alloc flags in the memory plan, the
``.pte`` on disk and read back as a runtime ``Program``, in-place cache semantics, the MoE experts switch.

Small synthetic modules (a few seconds per export) except where a transformers model is the point.
"""

from __future__ import annotations

import platform

import pytest
import torch

from hfexport import ExecutorchConfig, ExportedModel, UnsupportedError
from hfexport.exporter_executorch import ExecutorchExporter
from hfexport.testing.tiny import TINY_CASES

pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")


class CacheWriter(torch.nn.Module):
    """Writes ``x`` into ``cache`` at ``position`` in place (as a static cache does) and returns a projection."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x, cache, position):
        cache.index_copy_(1, position, x)
        return self.proj(cache).sum(dim=1)


def _writer_inputs():
    torch.manual_seed(0)
    return {"x": torch.randn(2, 1, 8), "cache": torch.zeros(2, 4, 8), "position": torch.tensor([1])}


@pytest.fixture(scope="module")
def writers():
    model = CacheWriter().eval()
    planned = ExecutorchExporter().export(model, _writer_inputs(), ExecutorchConfig())
    caller = ExecutorchExporter().export(model, _writer_inputs(), ExecutorchConfig(
        alloc_graph_input=False, alloc_graph_output=False, alloc_mutable_buffers=False))
    return model, planned, caller


def _planned(manager) -> dict[str, list[bool]]:
    """For the program's inputs and outputs: whether each tensor has memory in the plan (allocation_info set)."""
    plan = manager.executorch_program.execution_plan[0]

    def planned(index):
        value = plan.values[index].val
        return getattr(value, "allocation_info", None) is not None

    return {"inputs": [planned(i) for i in plan.inputs], "outputs": [planned(i) for i in plan.outputs]}


# --- backend selection ----------------------------------------------------------------------------------------------


def test_cuda_without_the_backend_fails_before_tracing(monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CUDA backend may lower here")
    traced = []
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: traced.append(1))
    with pytest.raises(UnsupportedError, match=r"backend='cuda'\) cannot lower on this machine.*torch.cuda"):
        ExecutorchExporter().export(CacheWriter(), _writer_inputs(), ExecutorchConfig(backend="cuda"))
    assert not traced, "the check must come before tracing"


def test_mlx_refuses_a_static_cache():
    from transformers import StaticCache

    model = TINY_CASES["llama"].build()
    cache = StaticCache(config=model.config, max_cache_len=16)
    inputs = {"input_ids": torch.ones(1, 3, dtype=torch.long), "past_key_values": cache}
    with pytest.raises(UnsupportedError, match="MLX backend does not take a StaticCache.*DynamicCache"):
        ExecutorchExporter().export(model, inputs, ExecutorchConfig(backend="mlx"))


@pytest.mark.skipif(platform.system() == "Darwin" and platform.machine() == "arm64", reason="MLX can run here")
def test_mlx_is_refused_off_apple_silicon():
    with pytest.raises(UnsupportedError, match="MLX runs on Apple Silicon"):
        ExecutorchExporter().export(CacheWriter(), _writer_inputs(), ExecutorchConfig(backend="mlx"))


def test_unknown_backend_is_a_config_error():
    from hfexport import ConfigError

    with pytest.raises(ConfigError, match="backend"):
        ExecutorchConfig(backend="vulkan2")


# --- memory planning --------------------------------------------------------------------------------------------


def test_alloc_flags_decide_what_the_memory_plan_holds(writers):
    _, planned, caller = writers
    default, off = _planned(planned.program), _planned(caller.program)
    assert all(default["inputs"]) and all(default["outputs"])
    assert not any(off["inputs"]), "alloc_graph_input=False: the runtime reads the caller's buffers"
    assert not any(off["outputs"]), "alloc_graph_output=False: the caller binds every output"


def test_in_place_update_lands_in_the_callers_cache_and_output_matches(writers):
    model, planned, _ = writers
    inputs, expected_inputs = _writer_inputs(), _writer_inputs()
    with torch.no_grad():
        expected = model(**expected_inputs)
    out = planned(**inputs)
    assert torch.allclose(out, expected, atol=1e-5)
    assert torch.equal(inputs["cache"], expected_inputs["cache"]) and inputs["cache"].abs().sum() > 0
    untouched = _writer_inputs()
    planned(share_inputs=False, **untouched)
    assert not untouched["cache"].any(), "share_inputs=False leaves the caller's tensors as they were"


def test_pte_round_trip_gives_a_runtime_program(writers, tmp_path):
    from executorch.runtime import Program

    model, planned, _ = writers
    planned.save_pretrained(tmp_path)
    assert (tmp_path / "model.pte").read_bytes()[4:8] == b"ET12", "an ExecuTorch flatbuffer program"
    reloaded = ExportedModel.from_pretrained(tmp_path)
    assert isinstance(reloaded.program, Program)
    inputs = _writer_inputs()
    with torch.no_grad():
        expected = model(**_writer_inputs())
    assert torch.allclose(reloaded(**inputs), expected, atol=1e-5)
    again = tmp_path / "again"
    reloaded.save_pretrained(again)  # a loaded program is saved by copying its file
    assert (again / "model.pte").read_bytes() == (tmp_path / "model.pte").read_bytes()


def test_a_program_lowered_for_a_delegate_this_runtime_lacks_is_refused_by_name(writers):
    """pip's runtime registers no CudaBackend: a CUDA program is refused before load_method's bare error code."""
    import copy

    from hfexport.backends.executorch.runner import ExecutorchRunner

    _, planned, _ = writers
    component = planned.components["model"]
    metadata = copy.deepcopy(component.metadata)
    metadata.export_config["backend"] = "cuda"
    with pytest.raises(UnsupportedError, match=r"backend='cuda'.*CudaBackend.*does not register.*EXECUTORCH_BUILD_CUDA"):
        ExecutorchRunner(component.program, metadata)


def test_runner_refuses_a_gpu_device(writers):
    _, planned, _ = writers
    with pytest.raises(UnsupportedError, match="CPU tensors"):
        planned.to("cuda")


# --- MoE experts ----------------------------------------------------------------------------------------------------


def test_moe_experts_switch_to_batched_mm_while_exporting_and_back():
    from hfexport.workarounds import applied_workarounds

    model = TINY_CASES["mixtral"].build()
    assert model.config._experts_implementation_internal == "grouped_mm"
    seen = []
    with applied_workarounds("executorch", model, {}) as fired:
        seen.append(model.config._experts_implementation_internal)
    assert "executorch-moe-batched-mm" in fired and seen == ["batched_mm"]
    assert model.config._experts_implementation_internal == "grouped_mm", "the model's own choice is put back"
    with applied_workarounds("onnx", model, {}) as fired:
        assert "executorch-moe-batched-mm" not in fired
    dense = TINY_CASES["llama"].build()
    with applied_workarounds("executorch", dense, {}) as fired:
        assert "executorch-moe-batched-mm" not in fired


# --- data-dependent tensor checks --------------------------------------------------------------------------------------


class _Checked(torch.nn.Module):
    """A tensor check as transformers' ``torch_compilable_check`` traces it (the multimodal "features match tokens")."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._check_tensor_all(x.sum(-1) > -1e9)
        return x * 2


def test_a_traced_tensor_check_is_dropped_before_the_core_aten_verifier():
    from hfexport.capture.graph_passes import drop_tensor_checks

    x = torch.randn(2, 3)
    program = torch.export.export(_Checked(), (x,))
    assert any(n.target == torch.ops.aten._is_all_true.default for n in program.graph.nodes)
    assert drop_tensor_checks(program) == 1
    assert not any(n.target == torch.ops.aten._is_all_true.default for n in program.graph.nodes)
    assert torch.equal(program.module()(x), x * 2)
    exported = ExecutorchExporter().export(_Checked(), {"x": x}, ExecutorchConfig())  # refused by to_edge before
    assert torch.equal(exported(x=x), x * 2)


class _BiasWindow(torch.nn.Module):
    """MPT's ALiBi slice: ``max(0, bias.size(1) - query_length)`` traces as ``torch.sym_max``, a Python function."""

    def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        start = max(0, bias.size(1) - x.size(1))
        return x + bias[:, start:]


def test_a_max_of_sizes_the_ranges_decide_is_resolved_before_the_edge_verifier():
    from hfexport.capture.graph_passes import resolve_sym_min_max

    x, bias = torch.randn(2, 8), torch.randn(2, 8)
    length = torch.export.Dim("length", min=2, max=64)
    keys = torch.export.Dim("keys", min=2, max=64)
    program = torch.export.export(_BiasWindow(), (x, bias), dynamic_shapes=({1: length}, {1: keys}))
    assert any(n.target is torch.sym_max for n in program.graph.nodes)  # ExecuTorch's verifier: AssertionError
    assert resolve_sym_min_max(program) == 0  # bias and queries of any lengths: the order is open, kept
    program = torch.export.export(_BiasWindow(), (x, torch.randn(2, 128)), dynamic_shapes=({1: length}, None))
    assert resolve_sym_min_max(program) == 1  # 128 - length >= 64: the difference itself
    assert not any(n.target is torch.sym_max for n in program.graph.nodes)
    for n in (3, 40):
        x, bias = torch.randn(2, n), torch.randn(2, 128)
        assert torch.equal(program.module()(x, bias), _BiasWindow()(x, bias))
    config = ExecutorchConfig(dynamic_shapes={"x": {1: torch.export.Dim("length", min=2, max=64)}, "bias": None})
    exported = ExecutorchExporter().export(_BiasWindow(), {"x": x, "bias": bias}, config)
    x = torch.randn(2, 5)
    assert torch.equal(exported(x=x, bias=bias), _BiasWindow()(x, bias))


class _MaxLastDim(torch.nn.Module):
    """An attention-sink style max over the last dim of a rank-4 tensor (GPT-OSS)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.max(dim=-1, keepdim=True).values


def test_a_max_over_the_last_dim_stays_outside_xnnpack_which_cannot_lower_it():
    """Without the workaround XNNPACK takes the node and then fails to lower it: the test fails once it can go."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    x = torch.randn(1, 2, 3, 5)
    with pytest.raises(Exception, match="amax.default only supports dim == 2 or dim == 3"):
        to_edge_transform_and_lower(torch.export.export(_MaxLastDim(), (x,)), partitioner=[XnnpackPartitioner()])
    exported = ExecutorchExporter().export(_MaxLastDim(), {"x": x}, ExecutorchConfig())
    assert "executorch-xnnpack-max-dim" in exported.components["model"].metadata.workarounds
    assert torch.allclose(exported(x=x), x - x.max(dim=-1, keepdim=True).values)


class _PatchGrid(torch.nn.Module):
    """A vision tower's patch grid (Inkling's): [batch, frames, channels, height, width] -> rank-8 patches, permuted
    and flattened to [batch, patches, patch values]."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, f, c, h, w = x.shape
        grid = x.reshape(b, f, c, 2, h // 2, 2, w // 2, 1).permute(0, 1, 3, 5, 7, 2, 4, 6)
        return grid.reshape(b, f * 4, -1) * 2


def test_a_tensor_of_more_than_six_dims_stays_outside_xnnpack_which_cannot_define_it(monkeypatch):
    """XNNPACK defines tensors of at most 6 dims: the rank-8 permute was delegated and the method failed to load
    (error 0x1; checked below with the workaround's check off). The test fails once the workaround can go."""
    from hfexport.workarounds import executorch_xnnpack_visitors

    x = torch.randn(2, 1, 3, 8, 8)
    want = _PatchGrid()(x)
    exported = ExecutorchExporter().export(_PatchGrid(), {"x": x}, ExecutorchConfig())
    assert "executorch-xnnpack-max-rank" in exported.components["model"].metadata.workarounds
    assert torch.equal(exported(x=x), want)

    monkeypatch.setattr(executorch_xnnpack_visitors, "_MAX_RANK", 8)
    unfixed = ExecutorchExporter().export(_PatchGrid(), {"x": x}, ExecutorchConfig())
    with pytest.raises(RuntimeError, match="Failed to load method forward"):
        unfixed(x=x)


class _RotateHalf(torch.nn.Module):
    """GPT-J style rotate-half (Cohere, ERNIE 4.5): ``stack(..., dim=-1)`` is a trailing unsqueeze per operand."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([-x[..., 1::2], x[..., ::2]], dim=-1).flatten(-2) * 2


def test_a_trailing_unsqueeze_with_two_dynamic_dims_stays_outside_xnnpack_which_cannot_lower_it():
    """Batch and length dynamic: XNNPACK takes the unsqueeze, then its static reshape refuses two dynamic dims.
    The test fails once the workaround can go."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    x = torch.randn(2, 3, 8)
    shapes = {"x": {0: torch.export.Dim("batch", max=8), 1: torch.export.Dim("length", max=64)}}
    with pytest.raises(Exception, match="XNNPACK reshape only supports 1 dynamic dimension"):
        to_edge_transform_and_lower(
            torch.export.export(_RotateHalf(), (), {"x": x}, dynamic_shapes=shapes),
            partitioner=[XnnpackPartitioner()])
    exported = ExecutorchExporter().export(_RotateHalf(), {"x": x}, ExecutorchConfig(dynamic_shapes=shapes))
    assert "executorch-xnnpack-unsqueeze-dynamic" in exported.components["model"].metadata.workarounds
    other = torch.randn(3, 5, 8)  # another batch and length than traced
    assert torch.equal(exported(x=other), _RotateHalf()(other))


class _Scaled(torch.nn.Module):
    def forward(self, x: torch.Tensor, scale: int = 1, bias: torch.Tensor | None = None) -> torch.Tensor:
        return x * scale if bias is None else x * scale + bias


def test_inputs_specialised_to_constants_are_fed_to_the_method_which_keeps_them_as_inputs():
    """An int and a None kwarg stay inputs of the ExecuTorch method (set_inputs refused 7 tensors for 8 inputs with
    error 0x12: Gemma 3's decode); the runner feeds their traced values, and the diagnosis names a bad shape."""
    x = torch.randn(2, 3)
    exported = ExecutorchExporter().export(_Scaled(), {"x": x, "scale": 3, "bias": None}, ExecutorchConfig())
    assert exported.runner()._constant_slots == [(1, 3), (2, None)]
    assert torch.equal(exported(x=x, scale=3), x * 3)
    static = r"cannot take its inputs: 'x' \[4, 3\]: dim 0 is static at 2 \(traced \[2, 3\]\)"
    with pytest.raises(UnsupportedError, match=static):
        exported(x=torch.randn(4, 3), scale=3)


class _ScaledAfterNone(torch.nn.Module):
    """Whisper's encoder as called by generate: ``attention_mask=None`` first, a query scaled by a Python float."""

    def forward(self, attention_mask: torch.Tensor | None = None, x: torch.Tensor | None = None) -> torch.Tensor:
        return x * 0.25 if attention_mask is None else x * attention_mask


def test_a_lifted_scalar_after_an_input_traced_as_none_keeps_the_signatures_order():
    """to_edge lifts the 0.25 to a constant placeholder, placed after the None input but specified before it; the
    test fails once the workaround can go."""
    from executorch.exir import to_edge_transform_and_lower

    x = torch.randn(2, 3)
    inputs = {"attention_mask": None, "x": x}
    with pytest.raises(Exception, match="_lifted_tensor_constant0 does not match node name attention_mask"):
        to_edge_transform_and_lower(torch.export.export(_ScaledAfterNone(), (), inputs))
    exported = ExecutorchExporter().export(_ScaledAfterNone(), inputs, ExecutorchConfig())
    assert "executorch-lifted-constant-order" in exported.components["model"].metadata.workarounds
    assert torch.equal(exported(attention_mask=None, x=x), x * 0.25)


def test_placeholders_already_in_the_signatures_order_are_left_as_they_are():
    from hfexport.workarounds.executorch_lifted_constants import order_placeholders

    program = torch.export.export(_ScaledAfterNone(), (), {"attention_mask": None, "x": torch.randn(2, 3)})
    before = [n.name for n in program.graph.nodes if n.op == "placeholder"]
    assert not order_placeholders(program)
    assert [n.name for n in program.graph.nodes if n.op == "placeholder"] == before


class _Buckets(torch.nn.Module):
    """Idefics3's patch position ids: fractional coordinates bucketized over fixed boundaries."""

    def forward(self, coords: torch.Tensor) -> torch.Tensor:
        boundaries = torch.arange(1 / 8, 1.0, 1 / 8)
        return torch.bucketize(coords, boundaries, right=True) * 8 + torch.bucketize(coords, boundaries)


def test_bucketize_is_counted_against_the_boundaries_where_executorch_has_no_kernel():
    """"Operator torch._ops.aten.bucketize.Tensor is not in Core ATen opset" without executorch-bucketize."""
    coords = torch.cat([torch.rand(2, 20), torch.arange(0, 1, 1 / 8).expand(2, 8)], dim=1)  # ties on boundaries
    exported = ExecutorchExporter().export(_Buckets(), {"coords": coords}, ExecutorchConfig())
    assert "executorch-bucketize" in exported.components["model"].metadata.workarounds
    assert torch.equal(exported(coords=coords), _Buckets()(coords))


@pytest.mark.sweep  # (~30 s: the matrix's ExecuTorch rows export this family too)
def test_gpt2_exports_with_a_contiguous_copy_where_the_retrace_transposes_sdpas_output():
    """"Cannot view a tensor with shape torch.Size([2, 6, 64]) and strides (64, 128, 1)" in to_edge's re-trace
    without executorch-transposed-views."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    model = build_model("gpt2", "GPT2LMHeadModel")
    inputs = sample_inputs(model, "gpt2")
    exported = ExecutorchExporter().export(model, inputs, ExecutorchConfig())
    assert "executorch-transposed-views" in exported.components["model"].metadata.workarounds
    with torch.no_grad():
        expected = model(**inputs).logits
    assert (exported(**inputs).logits - expected).abs().max() <= 1e-3


def test_a_1d_convolution_over_a_dynamic_batch_and_length_stays_outside_xnnpack_which_cannot_reshape_it():
    """An audio encoder's convolutional front end (Moonshine, Speech2Text, Parakeet): "XNNPACK reshape only supports
    1 dynamic dimension" without executorch-xnnpack-conv1d-dynamic."""
    conv = torch.nn.Sequential(torch.nn.Conv1d(4, 8, 3, stride=2), torch.nn.GELU()).eval()
    x = torch.randn(2, 4, 16)
    exported = ExecutorchExporter().export(conv, {"input": x}, ExecutorchConfig(dynamic=True))
    assert "executorch-xnnpack-conv1d-dynamic" in exported.components["model"].metadata.workarounds
    for shape in ((2, 4, 16), (3, 4, 21)):
        x = torch.randn(*shape)
        with torch.no_grad():
            assert (exported(input=x) - conv(x)).abs().max() < 1e-5


def test_a_batch_norm_over_a_dynamic_batch_and_length_stays_outside_xnnpack_which_cannot_reshape_it():
    """A conformer convolution module's BatchNorm1d (Parakeet, Canary, Cohere ASR): XNNPACK decomposes it into a 1-D
    convolution, and "XNNPACK reshape only supports 1 dynamic dimension" without
    executorch-xnnpack-batchnorm1d-dynamic."""
    norm = torch.nn.Sequential(torch.nn.GELU(), torch.nn.BatchNorm1d(4)).eval()
    with torch.no_grad():  # statistics that make the norm do something
        norm[1].running_mean.uniform_(-1, 1)
        norm[1].running_var.uniform_(0.5, 2)
    exported = ExecutorchExporter().export(norm, {"input": torch.randn(2, 4, 16)}, ExecutorchConfig(dynamic=True))
    assert "executorch-xnnpack-batchnorm1d-dynamic" in exported.components["model"].metadata.workarounds
    for shape in ((2, 4, 16), (3, 4, 21)):
        x = torch.randn(*shape)
        with torch.no_grad():
            assert (exported(input=x) - norm(x)).abs().max() < 1e-5

class _SplitHalves(torch.nn.Module):
    """GPT-2's q/k/v split in small: one split_with_sizes (a single Tensor[] return) over a dynamic batch."""

    def forward(self, x):
        first, second = x.split([2, 2], dim=-1)
        return (first * second).reshape(-1, 1) + x.view(-1, 1)[: first.numel()]


def test_a_split_over_the_dynamic_batch_keeps_the_batch_dynamic():
    """The edge verifier took len() of the split's first tensor and pinned the batch to the traced 2 without
    executorch-list-return-guard (GPT-2's decode then failed: "_ViewSpec is incompatible with its base")."""
    exported = ExecutorchExporter().export(_SplitHalves(), {"x": torch.randn(2, 4)}, ExecutorchConfig(dynamic=True))
    assert "executorch-list-return-guard" in exported.components["model"].metadata.workarounds
    for batch in (2, 3, 5):
        x = torch.randn(batch, 4)
        assert torch.allclose(exported(x=x), _SplitHalves()(x), atol=1e-6)


class _SharedAcrossPartitions(torch.nn.Module):
    """One weight read on both sides of an op XNNPACK does not take (cumsum): two partitions share the constant."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(8, 8))

    def forward(self, x):
        return torch.cumsum(x @ self.weight, dim=-1) @ self.weight


def test_a_constant_two_partitions_share_is_copied_without_verifying_the_whole_program_each_time(monkeypatch):
    """executorch-duplicate-validation: each copy re-ran the edge verifier over the whole program (HRM's tiny model
    spent 30 of 154 s there); the lowered program still runs like eager."""
    import sys

    import executorch.exir.backend.utils as backend_utils

    copies, validations = [], []
    copy_constant, validate = backend_utils.duplicate_constant_node, torch.export.ExportedProgram._validate

    def counting_copy(program, name):
        copies.append(name)
        return copy_constant(program, name)

    def counting_validate(self):
        validations.append(sys._getframe(1).f_code.co_name)
        return validate(self)

    monkeypatch.setattr(backend_utils, "duplicate_constant_node", counting_copy)
    monkeypatch.setattr(torch.export.ExportedProgram, "_validate", counting_validate)
    torch.manual_seed(0)
    model = _SharedAcrossPartitions()
    exported = ExecutorchExporter().export(model, {"x": torch.randn(3, 8)}, ExecutorchConfig(dynamic=False))
    assert "executorch-duplicate-validation" in exported.components["model"].metadata.workarounds
    assert copies  # the premise: the weight is copied for a second partition
    assert validations and "duplicate_constant_node" not in validations
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert torch.allclose(exported(x=x), model(x), atol=1e-4)


class _CheckedCount(torch.nn.Module):
    """A runtime assert on a data-dependent size: torch._check(n != 0) traces as torch.sym_not of a comparison."""

    def forward(self, x, count):
        n = count.item()
        torch._check(n != 0)
        torch._check(n <= x.shape[0])
        return x * n


def test_a_runtime_assert_on_a_data_dependent_size_lowers_with_the_prim_ops_executorch_maps_it_to():
    """A bare AssertionError from the edge verifier (torch.sym_not is a Python function) without
    executorch-python-sym-ops (Idefics3, GLM-5-Next, ModernVBERT got no further)."""
    exported = ExecutorchExporter().export(_CheckedCount(), {"x": torch.randn(4, 3), "count": torch.tensor(2)},
                                           ExecutorchConfig(dynamic=True))
    assert "executorch-python-sym-ops" in exported.components["model"].metadata.workarounds
    x = torch.randn(4, 3)
    for count in (1, 3):
        assert torch.allclose(exported(x=x, count=torch.tensor(count)), x * count)


@pytest.mark.parametrize("shape", [(2, 3, 8, 16, 16), (2, 3, 9, 18, 17)])
def test_a_video_tubelet_convolution_is_the_same_linear_over_its_windows(shape):
    """ViViT / VideoMAE cut a clip into tubelets with a Conv3d of stride = kernel, which ExecuTorch's portable kernel
    cannot run (5-D input: error 0x12) and XNNPACK does not delegate (workaround executorch-conv3d-patches); the
    remainder a strided convolution drops (9 frames, 17 pixels) is dropped too."""
    from hfexport.workarounds.executorch_conv3d_patches import _is_patch_embedding, _tubelets

    torch.manual_seed(0)
    conv, x = torch.nn.Conv3d(3, 7, (2, 4, 4), stride=(2, 4, 4)), torch.randn(*shape)
    assert _is_patch_embedding(conv, x)
    with torch.no_grad():
        assert (_tubelets(conv, x) - conv(x)).abs().max() <= 1e-5
    overlapping = torch.nn.Conv3d(3, 7, (2, 4, 4), stride=(1, 2, 2))  # windows that overlap keep their forward
    assert not _is_patch_embedding(overlapping, x)


@pytest.mark.sweep  # (~30 s: the matrix's ExecuTorch rows export this family too)
def test_a_video_model_exports_to_executorch_like_eager():
    from hfexport.tools.matrix.worker import run_case

    result = run_case("vivit", "VivitModel", "feature-extraction", "executorch", "export")
    assert result["status"] == "pass", result["reason"]
    assert result["max_abs_diff"] <= 1e-3
