"""HQQ's float zero points kept off MatMulNBits' slow path (quantizers/onnx_offsets.py): the fast symmetric kernel plus
a product of the input's block sums with each block's float offset. References: ONNX Runtime running the float-zero-
point MatMulNBits its own quantizer wrote, and numpy's product with the original weights."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="MatMulNBits is an ONNX Runtime contrib op: the onnx extra is not installed")

K, N, BLOCK = 128, 96, 32


def _graph(weights: list[np.ndarray], rank: int = 3):
    """x ([2, 3, K] or [6, K]) @ each weight: one output per weight, all reading the same input."""
    import onnx_ir as ir

    shape = [2, 3, K] if rank == 3 else [6, K]
    x = ir.Value(name="x", shape=ir.Shape(shape), type=ir.TensorType(ir.DataType.FLOAT))
    values, nodes, outputs = [], [], []
    for i, data in enumerate(weights):
        w = ir.Value(name=f"w{i}", shape=ir.Shape(data.shape), type=ir.TensorType(ir.DataType.FLOAT),
                     const_value=ir.tensor(data, name=f"w{i}"))
        node = ir.node("MatMul", [x, w], name=f"matmul{i}")
        node.outputs[0].name = f"y{i}"
        values.append(w), nodes.append(node), outputs.append(node.outputs[0])
    graph = ir.Graph([x], outputs, nodes=nodes, initializers=values, opset_imports={"": 21})
    return ir.Model(graph, ir_version=10)


def _run(model, x):
    import onnx_ir as ir
    import onnxruntime as ort

    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})


def _quantize(weights, split, accuracy_level=None, rank=3):
    from hfexport import OnnxRuntimeWeightOnlyConfig
    from hfexport.quantizers.onnx_nbits import quantize_nbits

    config = OnnxRuntimeWeightOnlyConfig(bits=4, algorithm="HQQ", split_zero_points=split,
                                         accuracy_level=accuracy_level, op_types_to_quantize=("MatMul",))
    return quantize_nbits(_graph(weights, rank), config)


@pytest.mark.parametrize("rank", [3, 2])
def test_split_zero_points_compute_what_the_float_zero_point_kernel_does(rank):
    """Same products as ONNX Runtime's float-zero-point MatMulNBits (its reference path) to float rounding; each
    MatMulNBits has no zero point input left (the fast kernel), the two products share one block sum of x, each
    offset table is [K / block, N]."""
    rng = np.random.default_rng(0)
    weights = [rng.standard_normal((K, N)).astype(np.float32) for _ in range(2)]
    x = rng.standard_normal((2, 3, K) if rank == 3 else (6, K)).astype(np.float32)
    float_zero = _quantize(weights, split=False, rank=rank)
    split = _quantize(weights, split=True, rank=rank)
    kernels = [n for n in float_zero.graph if n.op_type == "MatMulNBits"]
    assert all(len(n.inputs) == 4 and n.inputs[3].const_value.dtype.name == "FLOAT" for n in kernels)
    ops = [n.op_type for n in split.graph]
    assert sorted(ops) == sorted(["Reshape", "ReduceSum"] + ["MatMulNBits", "MatMul", "Add"] * 2), ops
    assert all(len(n.inputs) == 3 for n in split.graph if n.op_type == "MatMulNBits")
    tables = [n.inputs[1].const_value.numpy() for n in split.graph if n.op_type == "MatMul"]
    assert [t.shape for t in tables] == [(K // BLOCK, N)] * 2
    assert [o.name for o in split.graph.outputs] == ["y0", "y1"]
    expected, got = _run(float_zero, x), _run(split, x)
    exact = [x @ w for w in weights]
    for e, g, f in zip(expected, got, exact):
        assert np.abs(g - e).max() <= 1e-4 * np.abs(e).max()
        assert np.abs(g - f).max() > 1e-3  # still 4-bit: the comparison above is not float against float


def test_a_weight_on_a_grid_with_float_offsets_is_kept_by_split_hqq_and_not_by_integer_zero_points():
    """A weight already on a 4-bit grid per block of 32 with float offsets (q * d + m, a dequantized GGUF Q4_1):
    HQQ's codes through the split form give it back almost exactly; round to nearest with integer zero points, the
    other form the fast kernel takes, does not."""
    from hfexport import OnnxRuntimeWeightOnlyConfig
    from hfexport.quantizers.onnx_nbits import quantize_nbits

    rng = np.random.default_rng(1)
    # llama.cpp's Q4_1 of a normal weight, per block of 32 inputs: d = (max - min) / 15 and m = min in float16
    source = (rng.standard_normal((K // BLOCK, BLOCK, N)) * 0.05).astype(np.float32)
    low, high = source.min(1, keepdims=True), source.max(1, keepdims=True)
    d = ((high - low) / 15).astype(np.float16).astype(np.float32)
    m = low.astype(np.float16).astype(np.float32)
    weight = (np.clip(np.round((source - m) / d), 0, 15) * d + m).reshape(K, N)
    x = rng.standard_normal((2, 3, K)).astype(np.float32)
    exact = x @ weight
    split = _run(_quantize([weight], split=True), x)[0]
    integer = _run(quantize_nbits(_graph([weight]), OnnxRuntimeWeightOnlyConfig(
        bits=4, is_symmetric=False, accuracy_level=None, op_types_to_quantize=("MatMul",))), x)[0]
    split_error, integer_error = np.abs(split - exact).max(), np.abs(integer - exact).max()
    assert split_error * 20 < integer_error, (split_error, integer_error)
    assert split_error < 1e-3 * np.abs(exact).max()


def test_split_zero_points_is_for_hqq_only():
    from hfexport import OnnxRuntimeWeightOnlyConfig

    with pytest.raises(ValueError, match=r"split_zero_points=True.*algorithm='DEFAULT'.*use algorithm='HQQ'"):
        OnnxRuntimeWeightOnlyConfig(bits=4, split_zero_points=True)
