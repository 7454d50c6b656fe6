"""Group-wise weights written into OpenVINO models (hfexport.quantizers.openvino_groups).

HQQ int4: the IR keeps u4 codes with float zero points, OpenVINO's CPU plugin computes what ONNX Runtime's HQQ
solver's codes mean, and a weight already on a 4-bit grid with float offsets (a dequantized GGUF Q4_1, like the
packaged SmolLM2) comes back nearly exactly, which integer zero points cannot do. int8: one scale per group of 32,
which keeps a block-quantized weight's blocks apart where one scale per output channel mixes them."""

from __future__ import annotations

import numpy as np
import pytest

ov = pytest.importorskip("openvino", reason="the openvino extra is not installed")
pytest.importorskip("onnxruntime", reason="ONNX Runtime's HQQ solver: the quantization extra is not installed")

import openvino.opset13 as ops  # noqa: E402

from hfexport.quantizers.openvino_groups import compress_groups  # noqa: E402

GROUP = 32


def _model(weight: np.ndarray, transpose_b: bool) -> ov.Model:
    x = ops.parameter([4, 64], np.float32, name="x")
    matmul = ops.matmul(x, ops.constant(weight), transpose_a=False, transpose_b=transpose_b, name="proj")
    return ov.Model([matmul], [x])


def _q4_1_grid(rng: np.random.Generator, rows: int, cols: int) -> np.ndarray:
    """A [rows, cols] weight as llama.cpp's Q4_1 stores and dequantizes it: per block of 32 inputs of a normal weight,
    ``d = (max - min) / 15`` and ``m = min`` in float16, codes ``round((x - min) / d)``, weight ``q * d + m``."""
    x = (rng.standard_normal((rows, cols // GROUP, GROUP)) * 0.05).astype(np.float32)
    low, high = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
    d = ((high - low) / 15).astype(np.float16).astype(np.float32)
    m = low.astype(np.float16).astype(np.float32)
    q = np.clip(np.round((x - m) / d), 0, 15)
    return (q * d + m).reshape(rows, cols).astype(np.float32)


def _run(model: ov.Model, data: np.ndarray) -> np.ndarray:
    """The weights as the plugin decompresses them: its dynamic quantization of activations (int8, groups of 32,
    which it applies to int8 weights) off."""
    config = {"INFERENCE_PRECISION_HINT": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}
    return ov.Core().compile_model(model, "CPU", config)(data)[0]


def test_a_q4_1_weight_comes_back_through_float_zero_points_which_integer_ones_cannot_hold():
    rng = np.random.default_rng(0)
    weight = _q4_1_grid(rng, 48, 64)
    data = rng.standard_normal((4, 64)).astype(np.float32)
    expected = data @ weight.T
    model = _model(weight, transpose_b=True)
    assert compress_groups(model, 4, GROUP, parameter_type="f32") == 1
    constants = {op.get_element_type().get_type_name(): op for op in model.get_ordered_ops()
                 if op.get_type_name() == "Constant" and op.get_element_type().get_type_name() in ("u4", "f32")}
    assert tuple(constants["u4"].get_output_shape(0)) == (48, 2, GROUP)
    zeros = [op.get_data() for op in model.get_ordered_ops() if op.get_type_name() == "Subtract"
             for op in [op.input_value(1).get_node()]]
    assert len(zeros) == 1 and zeros[0].shape == (48, 2, 1)
    assert np.abs(zeros[0] - np.round(zeros[0])).max() > 0.1  # float zero points: Q4_1's offsets are not integers
    got = _run(model, data)
    # the same grid with integer zero points (the best of round-to-nearest over each block's range)
    blocks = weight.reshape(48, 2, GROUP)
    low, high = blocks.min(-1, keepdims=True), blocks.max(-1, keepdims=True)
    scale = (high - low) / 15
    zero = np.round(-low / scale)
    integer = ((np.clip(np.round(blocks / scale) + zero, 0, 15) - zero) * scale).reshape(48, 64)
    integer_error = np.abs(data @ integer.T - expected).max()
    error = np.abs(got - expected).max()
    assert error < integer_error / 20, (error, integer_error)
    assert error < 1e-3 * np.abs(expected).max()


@pytest.mark.parametrize("transpose_b", [True, False], ids=["out-in", "in-out"])
@pytest.mark.parametrize("parameter_type", ["f16", "f32"])
def test_the_plugin_computes_what_the_solvers_codes_mean(transpose_b, parameter_type):
    """The reference is ONNX Runtime's HQQ solver run here on the weight, dequantized in numpy."""
    import torch
    from onnxruntime.quantization.matmul_nbits_quantizer import HQQWeightOnlyQuantConfig, HQQWeightOnlyQuantizer

    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((40, 64)) * 0.05).astype(np.float32)  # [out, in]
    data = rng.standard_normal((4, 64)).astype(np.float32)
    solver = HQQWeightOnlyQuantizer(HQQWeightOnlyQuantConfig(block_size=GROUP, bits=4))
    codes, scale, zero = solver.quantize_internal(torch.from_numpy(weight), bits=4, group_size=GROUP, axis=1)
    cast = np.float16 if parameter_type == "f16" else np.float32
    scale = scale.numpy().reshape(40, 2, 1).astype(cast).astype(np.float32)
    zero = zero.numpy().reshape(40, 2, 1).astype(cast).astype(np.float32)
    dequantized = ((codes.numpy().reshape(40, 2, GROUP) - zero) * scale).reshape(40, 64)
    model = _model(weight if transpose_b else np.ascontiguousarray(weight.T), transpose_b)
    assert compress_groups(model, 4, GROUP, parameter_type=parameter_type) == 1
    got = _run(model, data)
    assert np.abs(got - data @ dequantized.T).max() < 1e-4
    assert np.abs(got - data @ weight.T).max() > 1e-3  # and it is a 4-bit weight, not the float one


def test_a_weight_whose_inputs_the_groups_do_not_divide_or_a_skipped_one_stays_float():
    rng = np.random.default_rng(2)
    model = _model(rng.standard_normal((16, 64)).astype(np.float32), transpose_b=True)
    assert compress_groups(model, 4, GROUP, skip={"proj"}) == 0
    assert compress_groups(model, 8, 128) == 0  # 64 inputs: no group of 128
    assert {op.get_element_type().get_type_name() for op in model.get_ordered_ops()
            if op.get_type_name() == "Constant"} == {"f32"}


@pytest.mark.parametrize("transpose_b", [True, False], ids=["out-in", "in-out"])
def test_int8_groups_keep_each_blocks_range_where_one_scale_per_channel_mixes_them(transpose_b):
    """A weight whose blocks of 32 inputs have ranges 30x apart (as a block-quantized file leaves them): the plugin
    computes the numpy reference of symmetric int8 per group (f16 scales), and its error is far under that of one
    int8 scale per output channel on the same weight."""
    rng = np.random.default_rng(3)
    weight = (rng.standard_normal((40, 64)) * np.repeat([0.01, 0.3], 32)[None, :]).astype(np.float32)
    data = rng.standard_normal((4, 64)).astype(np.float32)
    groups = weight.reshape(40, 2, GROUP)
    scale = (np.abs(groups).max(-1, keepdims=True) / 127).astype(np.float16).astype(np.float32)
    reference = (np.clip(np.round(groups / scale), -127, 127) * scale).reshape(40, 64)
    channel_scale = np.abs(weight).max(1, keepdims=True) / 127
    per_channel = np.clip(np.round(weight / channel_scale), -127, 127) * channel_scale
    model = _model(weight if transpose_b else np.ascontiguousarray(weight.T), transpose_b)
    assert compress_groups(model, 8, GROUP) == 1
    assert {op.get_element_type().get_type_name() for op in model.get_ordered_ops()
            if op.get_type_name() == "Constant" and tuple(op.get_output_shape(0)) == (40, 2, GROUP)} == {"i8"}
    got = _run(model, data)
    assert np.abs(got - data @ reference.T).max() < 1e-4
    small = slice(0, 32)  # the inputs of the small block: where one scale per channel loses most
    error = np.abs(weight[:, small] - reference[:, small]).max()
    assert error * 10 < np.abs(weight[:, small] - per_channel[:, small]).max()


def test_the_config_refuses_what_it_cannot_write():
    from hfexport.quantizers.openvino_groups import GroupWeightConfig

    with pytest.raises(ValueError, match="zero_points='none'"):
        GroupWeightConfig(bits=8, zero_points="hqq")
    with pytest.raises(ValueError, match="power of two"):
        GroupWeightConfig(group_size=48)
    with pytest.raises(ValueError, match="4 or 8"):
        GroupWeightConfig(bits=2)


def test_an_export_merges_the_projections_before_compressing_them_and_runs_close_to_eager():
    """int8-groups on the tiny Llama: the q/k/v and gate/up weights are compressed as the merged products the CPU
    plugin runs fastest (two per layer, plus o_proj and down_proj), the lm_head is NNCF's per-channel int8 (the
    recipe's backup), and the logits stay within int8 rounding of eager's."""
    import torch

    from hfexport import AutoExportConfig, AutoHfExporter
    from hfexport.quantizers.presets import recipe
    from hfexport.testing.tiny import TINY_CASES

    case = TINY_CASES["llama"]
    model = case.build()
    inputs = case.inputs(2, 7)
    config = AutoExportConfig.from_dict({"export_format": "openvino", "dynamic": True})
    config.quantizer = recipe("int8-groups", "openvino")
    exported = AutoHfExporter.from_config(config).export(model, inputs, config)
    ir = exported.components["model"].program
    compressed = [op for op in ir.get_ordered_ops() if op.get_type_name() == "Constant"
                  and op.get_element_type().get_type_name() == "i8" and len(op.get_output_shape(0)) == 3]
    layers = model.config.num_hidden_layers
    assert len(compressed) == 4 * layers, [tuple(c.get_output_shape(0)) for c in compressed]
    head = [op for op in ir.get_ordered_ops() if op.get_type_name() == "Constant"
            and op.get_element_type().get_type_name() == "i8"
            and tuple(op.get_output_shape(0)) == (model.config.vocab_size, model.config.hidden_size)]
    assert len(head) == (1 if model.config.tie_word_embeddings else 2)  # the embedding's table too
    widths = sorted({c.get_output_shape(0)[0] for c in compressed})
    hidden, heads, kv = model.config.hidden_size, model.config.num_attention_heads, model.config.num_key_value_heads
    head_dim = hidden // heads
    assert hidden + 2 * kv * head_dim in widths and 2 * model.config.intermediate_size in widths
    with torch.no_grad():
        eager = model(**inputs).logits
    got = exported(**inputs).logits
    diff = float((got - eager).abs().max())
    assert 0 < diff < 0.05 * float(eager.abs().max()), diff
