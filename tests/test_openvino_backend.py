"""The OpenVINO backend's contract: files on disk, precision, stateful variables and beam_idx, state reset, errors.

Tiny Llama exports only (seconds each); module-scoped fixtures share them between tests.
"""

from __future__ import annotations

import pytest
import torch

from hfexport import ConfigError, ExportedModel, MissingPackageError, OpenVINOConfig
from hfexport.errors import ExportError
from hfexport.exporter_openvino import OpenVINOExporter
from hfexport.validation import compare_outputs
from backend_fixtures import CASE, model, plain_fixture, static_config  # noqa: F401 (model: a fixture)

plain = plain_fixture(OpenVINOExporter, OpenVINOConfig(dynamic=True))


@pytest.fixture(scope="module")
def stateful(model):
    return OpenVINOExporter().export_for_generation(model, CASE.inputs(2, 6), OpenVINOConfig(dynamic=True),
                                                    generation_config=static_config(model), multi_token_decode=True)


@pytest.fixture(scope="module")
def saved_plain(plain, tmp_path_factory):
    """The plain export saved once per module (under pytest's temporary folder, which pytest cleans)."""
    directory = tmp_path_factory.mktemp("openvino-plain")
    plain.save_pretrained(directory)
    return directory


def test_program_is_an_openvino_model_saved_as_xml_and_bin(plain, tmp_path):
    import openvino as ov

    assert isinstance(plain.program, ov.Model)
    plain.save_pretrained(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert {"openvino_model.xml", "openvino_model.bin"} <= names, names
    assert (tmp_path / "openvino_model.bin").stat().st_size > 0.9 * sum(
        p.numel() * p.element_size() for p in CASE.build().parameters())


def test_fp32_export_runs_in_fp32_by_default_and_bf16_only_when_asked(plain, saved_plain, model):
    inputs = CASE.inputs(2, 7)
    with torch.no_grad():
        eager = model(**inputs)
    runner = plain.runner()
    assert str(runner.compiled.get_property("INFERENCE_PRECISION_HINT")) == "<Type: 'float32'>"
    assert compare_outputs(plain(**inputs), eager)["max_abs_diff"] <= 1e-4
    bf16 = ExportedModel.from_pretrained(saved_plain, config={"INFERENCE_PRECISION_HINT": "bf16"})
    assert bf16.runner().properties["INFERENCE_PRECISION_HINT"] == "bf16"  # asked of the plugin
    import openvino as ov

    # the plugin keeps the hint only where the CPU computes bf16 natively (an AVX2-only AMD EPYC reports f32)
    if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        assert "bfloat16" in str(bf16.runner().compiled.get_property("INFERENCE_PRECISION_HINT"))
        assert compare_outputs(bf16(**inputs), eager)["max_abs_diff"] > 1e-4


def test_compress_to_fp16_halves_the_weights_and_stays_close(model, saved_plain, tmp_path):
    half = OpenVINOExporter().export(model, CASE.inputs(2, 7), OpenVINOConfig(dynamic=True, compress_to_fp16=True))
    half.save_pretrained(tmp_path)
    full = (saved_plain / "openvino_model.bin").stat().st_size
    assert (tmp_path / "openvino_model.bin").stat().st_size < 0.6 * full
    inputs = CASE.inputs(2, 7)
    with torch.no_grad():
        eager = model(**inputs)
    assert compare_outputs(half(**inputs), eager)["max_abs_diff"] < 5e-2


def test_stateful_graph_keeps_the_cache_in_variables_with_beam_idx(stateful, tmp_path):
    assert stateful.components["prefill"] is stateful.components["decode"]  # one IR serves both
    program = stateful.components["decode"].program
    inputs = {n for port in program.inputs for n in port.get_names()}
    assert "beam_idx" in inputs and not any("past_key_values" in n for n in inputs), inputs
    outputs = {n for port in program.outputs for n in port.get_names()}
    assert outputs == {"logits"}, outputs
    n_cache = sum(1 for s in stateful.components["decode"].metadata.inputs if s.role.value == "cache_input")
    assert len(program.get_sinks()) == n_cache == len(program.get_variables())
    ops = {op.get_type_name() for op in program.get_ordered_ops()}
    assert {"ReadValue", "Assign", "Gather"} <= ops
    stateful.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.glob("*.xml")) == ["openvino_model.xml"]  # one IR for both components


def test_stateless_graph_takes_and_returns_the_cache(model):
    exported = OpenVINOExporter().export_for_generation(model, CASE.inputs(2, 6),
                                                        OpenVINOConfig(dynamic=True, stateful=False),
                                                        generation_config=static_config(model), multi_token_decode=True)
    program = exported.components["decode"].program
    assert not program.get_sinks()
    inputs = {n for port in program.inputs for n in port.get_names()}
    outputs = {n for port in program.outputs for n in port.get_names()}
    assert "past_key_values.layers.0.keys" in inputs and "present.past_key_values.layers.0.keys" in outputs
    assert "beam_idx" not in inputs


def test_a_foreign_cache_starts_a_new_sequence_and_the_returned_one_continues_it(stateful, model):
    runner = stateful.runner("decode")
    prompt = CASE.inputs(1, 5)
    decode_inputs = _decode_kwargs(stateful, prompt)
    first = runner(**decode_inputs["prefill"])
    cache = first.past_key_values
    assert cache is decode_inputs["prefill"]["past_key_values"]  # the handle standing for the state
    step = runner(**decode_inputs["step"](cache))
    restarted = runner(**decode_inputs["prefill"] | {"past_key_values": _fresh(stateful, 1)})
    assert torch.equal(restarted.logits, first.logits)  # a new cache object: the state was reset
    assert not torch.equal(step.logits[:, -1], first.logits[:, -1])
    live = runner.state()
    assert set(live) == {s.name for s in stateful.components["decode"].metadata.inputs if s.role.value == "cache_input"}
    assert live["past_key_values.layers.0.keys"][:, :, :5].abs().sum() > 0  # the prompt's keys are in the state
    assert live["past_key_values.layers.0.keys"][:, :, 5:].abs().sum() == 0
    runner.reset()
    again = runner(**decode_inputs["prefill"] | {"past_key_values": _fresh(stateful, 1)})
    assert torch.equal(again.logits, first.logits)


def _fresh(exported, batch):
    from hfexport.generation.loop import Component as _Component

    return _Component(exported, "decode").initial_cache(batch)


def _decode_kwargs(exported, prompt):
    from hfexport.generation.loop import Component as _Component, TextState

    decode = _Component(exported, "decode")
    ids, mask = prompt["input_ids"], prompt["attention_mask"]
    text = TextState(mask, 4, decode.cache_capacity(), None)
    prefill = {"input_ids": ids, **text.kwargs(decode, 0, ids.shape[1], decode.initial_cache(ids.shape[0]))}

    def step(cache):
        position = text.advance()
        return {"input_ids": ids[:, -1:], **text.kwargs(decode, position, 1, cache)}

    return {"prefill": prefill, "step": step}


def test_runner_options_config_and_torch_threads(plain, saved_plain):
    threads = torch.get_num_threads()
    try:
        exported = ExportedModel.from_pretrained(saved_plain, config={"INFERENCE_NUM_THREADS": 1}, torch_threads=1)
        runner = exported.runner()
        assert runner.compiled.get_property("INFERENCE_NUM_THREADS") == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(TypeError, match="config and torch_threads"):
        plain.to("cpu", providers=["CPUExecutionProvider"])


def test_bad_config_values_are_refused_before_any_work(model):
    with pytest.raises(ConfigError, match="stateful"):
        OpenVINOExporter().export(model, CASE.inputs(2, 7), {"stateful": "yes"})
    with pytest.raises(ConfigError, match="OpenVINOConfig"):
        from hfexport import OnnxConfig

        OpenVINOExporter().export(model, CASE.inputs(2, 7), OnnxConfig())


def test_missing_openvino_names_the_pip_line(monkeypatch, model):
    import importlib.metadata as md

    real = md.version
    monkeypatch.setattr(md, "version", lambda name: (_ for _ in ()).throw(md.PackageNotFoundError(name))
                        if name == "openvino" else real(name))
    with pytest.raises(MissingPackageError) as info:
        OpenVINOExporter().export(model, CASE.inputs(2, 7), OpenVINOConfig())
    assert "hfexport[openvino]" in info.value.pip_line and "openvino==" in info.value.pip_line


def test_workarounds_that_fired_are_recorded(stateful):
    assert "openvino-sdpa-masked-rows" in stateful.components["decode"].metadata.workarounds


def test_a_single_prompt_export_generates_like_eager(model):
    """A batch-1 sample (one prompt, the usual case) has its batch axis fixed by torch.export: the state variables
    keep that fixed size (their initial value once took beam_idx's dynamic batch, and the export failed)."""
    exported = OpenVINOExporter().export_for_generation(model, CASE.inputs(1, 6), OpenVINOConfig(dynamic=True))
    prompt = CASE.inputs(1, 9)
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=10, do_sample=False)
    assert torch.equal(exported.generate(**prompt, max_new_tokens=10, do_sample=False), expected)


def test_a_complex_rotary_embedding_converts_and_matches_eager():
    # DeepSeek-V2's rotary embedding is torch.polar + a complex multiply: the frontend has no aten.polar rule, so
    # it did not convert ("No conversion rule found for operations: aten.polar.default"); workaround
    # openvino-complex-rotary traces it with real arithmetic
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model
    from hfexport.workarounds.models.complex_rotary import rotate_pairs

    x, angles = torch.randn(2, 3, 5, 8), torch.randn(2, 1, 5, 4)
    expected = torch.view_as_real(torch.view_as_complex(x.reshape(2, 3, 5, 4, 2)) * torch.polar(
        torch.ones_like(angles), angles)).flatten(3)
    torch.testing.assert_close(rotate_pairs(x, torch.stack([angles.cos(), angles.sin()], -1)), expected)
    torch.manual_seed(0)
    model = build_model("deepseek_v2", "DeepseekV2ForCausalLM")
    inputs = sample_inputs(model, "deepseek_v2")
    with torch.no_grad():
        eager = model(**inputs)
    exported = OpenVINOExporter().export(model, inputs, OpenVINOConfig())
    assert "openvino-complex-rotary" in exported.components["model"].metadata.workarounds
    report = compare_outputs(exported(**inputs), eager)
    assert not report["problems"] and report["max_abs_diff"] <= 1e-4, report


class _ChunkPad(torch.nn.Module):
    """Mamba-2's chunked scan pads the sequence to a whole number of chunks: ``(chunk - len % chunk) % chunk``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = (4 - x.size(1) % 4) % 4
        return torch.nn.functional.pad(x, (0, 0, 0, pad)).cumsum(1)


def test_a_size_modulo_of_a_dynamic_length_converts_and_matches_eager():
    """"No conversion rule found for operations: <built-in function mod>" without workaround
    openvino-symbolic-ints."""
    from hfexport.workarounds.openvino_symbolic_ints import sym_mod_as_floordiv

    x = torch.randn(2, 7, 8)
    length = torch.export.Dim("length", min=2, max=60)
    program = torch.export.export(_ChunkPad(), (x,), dynamic_shapes=({1: length},))
    assert sym_mod_as_floordiv(program) >= 1
    config = OpenVINOConfig(dynamic_shapes={"x": {1: torch.export.Dim("length", min=2, max=60)}})
    exported = OpenVINOExporter().export(_ChunkPad(), {"x": x}, config)
    assert "openvino-symbolic-ints" in exported.components["model"].metadata.workarounds
    for n in (5, 8, 13):
        x = torch.randn(2, n, 8)
        got, want = exported(x=x), _ChunkPad()(x)
        assert got.shape == want.shape and (got - want).abs().max() < 1e-5


class _OpenMinMax(torch.nn.Module):
    """A min and a max of sizes that the shape ranges leave open (a dynamic length against constants), as the
    V3.2-like indexers' ``min(index_topk, kv_len)`` and MPT's ``max(0, bias_len - query_len)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum(1) * min(x.size(1), 5) + max(x.size(1) - 6, 2)


def test_a_min_and_max_of_sizes_the_ranges_leave_open_convert_and_match_eager_on_both_sides():
    """"No conversion rule found for operations: <function sym_min>" without workaround openvino-symbolic-ints."""
    x = torch.randn(2, 7, 8)
    program = torch.export.export(_OpenMinMax(), (x,), dynamic_shapes=({1: torch.export.Dim("n", min=2, max=60)},))
    found = {node.target for node in program.graph.nodes}
    assert {torch.sym_min, torch.sym_max} <= found, found  # the trace keeps them: nothing for the frontend
    config = OpenVINOConfig(dynamic_shapes={"x": {1: torch.export.Dim("n", min=2, max=60)}})
    exported = OpenVINOExporter().export(_OpenMinMax(), {"x": x}, config)
    assert "openvino-symbolic-ints" in exported.components["model"].metadata.workarounds
    for n in (2, 4, 5, 6, 8, 9, 12, 31):  # each min/max on both sides of its crossing
        x = torch.randint(-3, 4, (2, n, 8)).float()  # whole numbers: every sum exact, a wrong size a whole step off
        got, want = exported(x=x), _OpenMinMax()(x)
        assert torch.equal(got, want), (n, got, want)


class _Chunks(torch.nn.Module):
    """Mamba-2's chunked scan in small: the length padded to whole chunks of 8, split into chunks (``-1``), and an
    einsum over them, whose decomposition sizes its views with the chunk count ``-((-n) // 8)``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pad = (8 - x.size(1) % 8) % 8
        keys = torch.nn.functional.pad(x, (0, 0, 0, pad)).reshape(x.size(0), -1, 8, 4)
        values = torch.nn.functional.pad(x[..., :3] * 2, (0, 0, 0, pad)).reshape(x.size(0), -1, 8, 3)
        return torch.einsum("bcln,bclp->bcpn", keys, values)


def test_a_ceil_division_of_sizes_converts_with_python_floor_semantics(monkeypatch):
    """The frontend's integer floordiv truncates: ``(-3) // 8`` gave 0 chunks and the CPU plugin's Reshape refused the
    pattern (workaround openvino-negative-floordiv, checked below by switching its rewrite off)."""
    from hfexport.workarounds import openvino_negative_floordiv

    x = torch.randn(2, 12, 4)  # two chunks when traced (one chunk would let the einsum's views assume one)
    exported = OpenVINOExporter().export(_Chunks(), {"x": x}, OpenVINOConfig(dynamic=True))
    for n in (3, 8, 9, 12, 17, 30):  # one to four chunks, whole and padded
        x = torch.randn(2, n, 4)
        got, want = exported(x=x), _Chunks()(x)
        assert got.shape == want.shape and (got - want).abs().max() < 1e-5, n

    monkeypatch.setattr(openvino_negative_floordiv, "ceil_divisions_as_positive", lambda program: 0)
    unfixed = OpenVINOExporter().export(_Chunks(), {"x": torch.randn(2, 12, 4)}, OpenVINOConfig(dynamic=True))
    with pytest.raises(RuntimeError, match="conflicts with the reshape pattern"):
        unfixed(x=torch.randn(2, 3, 4))


@pytest.mark.sweep  # (a matrix-family regression, ~25 s: in the sweep, as the others)
def test_a_hybrid_recurrent_state_loads_into_its_variables_and_generates_like_eager():
    """Jamba's recurrent state is ``[batch, 128, 16]`` as traced and ``[?, ?, ?]`` as converted: its variable
    started empty (``[batch, 0, 0]``) failed the CPU plugin's shape check at compile time, and its conv state's
    folded ``[?, 128, 0]`` refused the prefill's ``[2, 128, 3]`` (stateful._settled_shape, the batch * 0 start)."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    model = build_model("jamba", "JambaForCausalLM")
    capture = sample_inputs(model, "jamba", batch=2, seq=6, for_generation=True)
    prompt = sample_inputs(model, "jamba", batch=2, seq=9, for_generation=True)
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    exported = OpenVINOExporter().export_for_generation(model, capture, OpenVINOConfig(dynamic=True))
    decode = exported.components["decode"].program
    states = {str(op.get_output_partial_shape(0)) for op in decode.get_ordered_ops()
              if op.get_type_name() == "ReadValue"}
    inner, state = model.config.mamba_expand * model.config.hidden_size, model.config.mamba_d_state
    assert f"[?,{inner},{state}]" in states, states  # the recurrent state's sizes as traced
    assert torch.equal(exported.generate(**prompt, max_new_tokens=8), expected)


def test_an_input_the_graph_never_reads_is_dropped_by_the_frontend_and_not_fed():
    """Idefics3's vision tower takes the prompt's ``input_ids`` in ``**kwargs`` and never reads them; the frontend
    drops that input: "openvino.convert_model gave 1 inputs and 1 outputs; the traced signature has 2 and 1" before."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    model = build_model("idefics3_vision", "Idefics3VisionTransformer")
    inputs = sample_inputs(model, "idefics3_vision")
    assert set(inputs) == {"pixel_values", "input_ids"}
    exported = OpenVINOExporter().export(model, inputs, OpenVINOConfig())
    assert [p.get_friendly_name() for p in exported.program.get_parameters()] == ["pixel_values"]
    with torch.no_grad():
        expected = model(**inputs).last_hidden_state
    assert (exported(**inputs).last_hidden_state - expected).abs().max() <= 1e-3


class _MasksByLayerType(torch.nn.Module):
    """A decoder's dict of masks by layer type, traced with one it has no layer of (Inkling's full-attention mask),
    and position ids it does not read: the frontend drops the first unread input and keeps the second."""

    def forward(self, attention_mask: dict[str, torch.Tensor], position_ids: torch.Tensor,
                x: torch.Tensor) -> torch.Tensor:
        sliding, linear = attention_mask["sliding_attention"], attention_mask["linear_attention"]
        return x.masked_fill(~sliding[:, 0, :, : x.shape[-1]], 0.0) * linear[:, :, None].to(x.dtype)


def test_unread_inputs_the_frontend_drops_in_part_are_named_from_the_program(monkeypatch):
    """Which unread inputs the frontend drops is its own choice (here the first, not the position ids), and the
    names it leaves on the parameters are shifted ("position_ids" on the boolean mask): the ports are named from the
    one choice of unread program inputs that leaves the parameters' dtypes and ranks (Inkling on OpenVINO: "gave 4
    inputs and 13 outputs; the traced signature has 5 and 13" before)."""
    from hfexport.backends.openvino import convert

    gen = torch.Generator().manual_seed(0)
    masks = {"full_attention": torch.ones(2, 1, 4, 4, dtype=torch.bool),
             "sliding_attention": torch.rand(2, 1, 4, 4, generator=gen) > 0.3,
             "linear_attention": torch.randint(0, 2, (2, 4), generator=gen)}
    inputs = {"attention_mask": masks, "position_ids": torch.arange(4).expand(2, 4), "x": torch.randn(2, 4, 4)}
    exported = OpenVINOExporter().export(_MasksByLayerType(), inputs, OpenVINOConfig(dynamic=True))
    assert [p.get_friendly_name() for p in exported.program.get_parameters()] == \
        ["attention_mask.sliding_attention", "attention_mask.linear_attention", "position_ids", "x"]
    assert torch.equal(exported(**inputs), _MasksByLayerType()(**inputs))

    monkeypatch.setattr(convert, "_read_by_program", lambda program, params, metadata: None)
    with pytest.raises(ExportError, match="gave 4 inputs"):  # the premise: the frontend's own names do not fit
        OpenVINOExporter().export(_MasksByLayerType(), inputs, OpenVINOConfig(dynamic=True))


class _WithSizes(torch.nn.Module):
    """A backbone that returns its feature map's spatial sizes beside it (MaskFormer's Swin: ints)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        pooled = torch.nn.functional.avg_pool2d(x, 2)
        return pooled, (pooled.shape[-2], pooled.shape[-1])


def test_sizes_returned_beside_the_tensors_come_back_from_the_runner(without_workaround):
    """The frontend looks a returned int up among the graph's values ("4 is not in list"); the program's constant
    outputs become None before conversion (openvino-constant-outputs) and the runner returns them in their places."""
    x = torch.randn(2, 3, 8, 8)
    exported = OpenVINOExporter().export(_WithSizes(), {"x": x}, OpenVINOConfig())
    assert "openvino-constant-outputs" in exported.components["model"].metadata.workarounds
    got = exported(x=x)
    assert tuple(got[1]) == (4, 4) and torch.allclose(got[0], _WithSizes()(x)[0], atol=1e-6)

    without_workaround("openvino-constant-outputs")
    with pytest.raises(ExportError, match="not in list"):  # the premise
        OpenVINOExporter().export(_WithSizes(), {"x": x}, OpenVINOConfig())


def test_an_average_pool_wider_than_its_input_is_converted_as_the_mean_torch_computes():
    """EfficientNet's ``AvgPool2d(hidden_dim, ceil_mode=True)``: "Kernel after dilation has size (dim: 16) larger than
    the data shape after padding (dim: 3)" at compile time without openvino-global-avg-pool."""
    pool = torch.nn.Sequential(torch.nn.Conv2d(4, 6, 1), torch.nn.AvgPool2d(16, ceil_mode=True)).eval()
    x = torch.randn(2, 4, 3, 3)
    with torch.no_grad():
        expected = pool(x)
    assert expected.shape == (2, 6, 1, 1) and torch.allclose(expected, pool[0](x).mean((-2, -1), keepdim=True))
    exported = OpenVINOExporter().export(pool, {"input": x}, OpenVINOConfig())
    assert "openvino-global-avg-pool" in exported.components["model"].metadata.workarounds
    assert (exported(input=x) - expected).abs().max() < 1e-5


class _GroupedAttention(torch.nn.Module):
    """An encoder's grouped-query attention without a mask: transformers passes ``enable_gqa=True``."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.25, enable_gqa=True)


def test_a_grouped_query_sdpa_converts_with_its_key_value_heads_repeated():
    """"cannot convert aten.scaled_dot_product_attention.default" without openvino-sdpa-gqa (PE-Audio, GLM-ASR)."""
    inputs = {"q": torch.randn(2, 4, 5, 8), "k": torch.randn(2, 2, 5, 8), "v": torch.randn(2, 2, 5, 8)}
    exported = OpenVINOExporter().export(_GroupedAttention(), inputs, OpenVINOConfig())
    assert "openvino-sdpa-gqa" in exported.components["model"].metadata.workarounds
    assert (exported(**inputs) - _GroupedAttention()(**inputs)).abs().max() < 1e-5


class _Patches(torch.nn.Module):
    """PatchTST's patching: ``unfold`` over the time dimension."""

    def forward(self, past_values: torch.Tensor) -> torch.Tensor:
        return past_values.unfold(dimension=-2, size=4, step=3).sum(-1)


def test_unfold_over_a_static_dimension_converts_as_a_gather_of_its_windows():
    """"cannot convert aten.unfold.default" without openvino-unfold."""
    x = torch.randn(2, 13, 3)
    exported = OpenVINOExporter().export(_Patches(), {"past_values": x}, OpenVINOConfig())
    assert "openvino-unfold" in exported.components["model"].metadata.workarounds
    assert (exported(past_values=x) - _Patches()(x)).abs().max() < 1e-5


def _weight_products(program) -> list[list[int]]:
    """The ``[out, in]`` shapes of the constant weights the IR's MatMul nodes read, one list per product."""
    shapes = []
    for node in program.get_ordered_ops():
        if node.get_type_name() == "MatMul":
            weight = node.input_value(1).get_node()
            if weight.get_type_name() == "Constant":
                shapes.append(list(weight.get_output_shape(0)))
    return shapes


def test_projections_reading_one_activation_are_one_product_with_the_unmerged_results(model, monkeypatch, tmp_path):
    from hfexport.backends.openvino import projections

    plain = OpenVINOExporter().export(model, CASE.inputs(2, 7), OpenVINOConfig(dynamic=True))  # its own runner

    config = model.config
    heads, kv, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    hidden, inner, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    shapes = _weight_products(plain.program)
    # per layer: q|k|v as one [heads + 2 kv heads, hidden] product, gate|up as one [2 inner, hidden], o and down alone
    assert shapes.count([(heads + 2 * kv) * head_dim, hidden]) == layers, shapes
    head = [config.vocab_size, hidden]  # the lm_head, alone
    assert shapes.count([2 * inner, hidden]) == layers + (head == [2 * inner, hidden]), shapes
    assert len(shapes) == 4 * layers + 1, shapes  # qkv, o, gate|up, down per layer, and the lm_head
    # a tied or shared weight read elsewhere is never copied into a merged product: the .bin holds each weight once
    plain.save_pretrained(tmp_path)
    stored = (tmp_path / "openvino_model.bin").stat().st_size
    assert stored < 1.01 * sum(p.numel() * p.element_size() for p in model.parameters())

    monkeypatch.setattr(projections, "fuse_projections", lambda program: 0)
    unmerged = OpenVINOExporter().export(model, CASE.inputs(2, 7), OpenVINOConfig(dynamic=True))
    assert len(_weight_products(unmerged.program)) == 7 * layers + 1  # the switch above took effect
    inputs = CASE.inputs(2, 9)
    with torch.no_grad():
        eager = model(**inputs)
    merged_logits, unmerged_logits = plain(**inputs).logits, unmerged(**inputs).logits
    assert compare_outputs(plain(**inputs), eager)["max_abs_diff"] <= 1e-4
    difference = (merged_logits - unmerged_logits).abs().max()
    assert difference <= 1e-6, difference


class _EndOfImage(torch.nn.Module):
    """T5Gemma 2's encoder in small: one learned embedding written over every placeholder token by a boolean mask."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.end_of_image = torch.nn.Parameter(torch.randn(4))

    def forward(self, ids):
        x = self.embed(ids)
        x[ids == 3] = self.end_of_image.to(x.dtype)
        return x * 2


def test_a_boolean_mask_fill_converts_as_a_where():
    """"cannot convert SequenceMark, aten.index_put.default" without openvino-mask-fill."""
    torch.manual_seed(0)
    model = _EndOfImage().eval()
    exported = OpenVINOExporter().export(model, {"ids": torch.tensor([[1, 3, 5, 3], [3, 2, 2, 1]])},
                                         OpenVINOConfig(dynamic=True))
    assert "openvino-mask-fill" in exported.components["model"].metadata.workarounds
    for ids in (torch.tensor([[3, 3, 1], [4, 4, 4], [1, 2, 3]]), torch.tensor([[5, 6, 7, 8, 9]])):
        with torch.no_grad():
            assert torch.allclose(exported(ids=ids), model(ids), atol=1e-6)


def test_an_output_named_like_an_input_keeps_both_ports_and_runs_after_a_reload(tmp_path):
    """An encoder that returns its attention_mask (UDOP's): naming the output port took the name off the input port
    (a model's tensor names are unique), which the runner then could not feed ("input [] is not in its export
    metadata"); the output is named ``returned.attention_mask``."""

    class MaskEcho(torch.nn.Module):
        def forward(self, x, attention_mask):
            return {"hidden": x * attention_mask[..., None], "attention_mask": attention_mask}  # (as it came in)

    inputs = {"x": torch.randn(2, 3, 4), "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}
    exported = OpenVINOExporter().export(MaskEcho(), inputs, OpenVINOConfig())
    assert [sorted(p.get_names()) for p in exported.program.inputs] == [["x"], ["attention_mask"]]
    exported.save_pretrained(tmp_path)
    out = ExportedModel.from_pretrained(tmp_path)(**inputs)
    assert torch.equal(out["attention_mask"], inputs["attention_mask"])
    assert torch.allclose(out["hidden"], inputs["x"] * inputs["attention_mask"][..., None])


def test_a_decode_step_without_a_mask_generates_like_eager_on_the_fused_stateful_attention(without_workaround):
    """Kosmos-2's text model attends its one decode query with no mask: the frontend's scalar mask stopped the CPU
    plugin's fused attention-with-cache at the first step (workaround openvino-sdpa-no-mask). Its text model alone,
    tiny (the whole Kosmos-2 is a matrix case)."""
    from transformers import Kosmos2TextConfig
    from transformers.models.kosmos2.modeling_kosmos2 import Kosmos2TextForCausalLM

    torch.manual_seed(0)
    config = Kosmos2TextConfig(vocab_size=128, embed_dim=32, layers=2, ffn_dim=64, attention_heads=4,
                               max_position_embeddings=128)
    model = Kosmos2TextForCausalLM(config).eval()
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        expected = model.generate(**inputs, max_new_tokens=12, do_sample=False)

    def export():
        return OpenVINOExporter().export_for_generation(model, inputs, OpenVINOConfig(dynamic=True, stateful=True))

    exported = export()
    assert "openvino-sdpa-no-mask" in exported.components["decode"].metadata.workarounds
    assert torch.equal(exported.generate(**inputs, max_new_tokens=12), expected)

    without_workaround("openvino-sdpa-no-mask")
    with pytest.raises(RuntimeError, match="ScaledDotProductAttentionWithKVCache"):  # the premise, without it
        export().generate(**inputs, max_new_tokens=12)


@pytest.mark.sweep  # (a matrix-family regression, ~20 s: in the sweep, as the others)
def test_a_state_without_a_batch_axis_is_not_reordered_by_beam_idx():
    """xLSTM's cache keeps ``seqlen_offset`` as a [1] tensor beside states of the (symbolic) batch; gathered by
    ``beam_idx`` like the others it became [batch], and the CPU plugin refused its variable at the first decode
    step ("Can not clone with new dims. Descriptor's shape: {1} is incompatible with provided dimensions: {2}")."""
    import torch

    from hfexport import OpenVINOConfig
    from hfexport.exporter_openvino import OpenVINOExporter
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    torch.manual_seed(0)
    model = build_model("xlstm", "xLSTMForCausalLM")
    capture = sample_inputs(model, "xlstm", batch=2, seq=6, for_generation=True)
    prompt = sample_inputs(model, "xlstm", batch=2, seq=9, for_generation=True)
    exported = OpenVINOExporter().export_for_generation(model, capture, OpenVINOConfig(dynamic=True))
    decode = exported.components["decode"].program
    assigns = {op.get_variable_id(): op.get_input_partial_shape(0) for op in decode.get_ops()
               if op.get_type_name() == "Assign"}
    offset = next(shape for variable, shape in assigns.items() if "seqlen_offset" in variable)
    assert offset.is_static and offset.to_shape()[0] == 1
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=6, do_sample=False)
    assert torch.equal(exported.generate(**prompt, max_new_tokens=6), expected)
