"""The reshape clean-up after the ONNX Runtime fusions: it removes only reshapes that change nothing, and the graph
computes the same numbers before and after (checked by running both on ONNX Runtime)."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest

pytest.importorskip("onnxruntime", reason="the clean-up is checked by running graphs on ONNX Runtime")

from hfexport.backends.onnx.fusions.reshapes import collapse_reshapes  # noqa: E402


def _const(graph: ir.Graph, name: str, values: list[int]) -> ir.Value:
    array = np.array(values, dtype=np.int64)
    value = ir.Value(name=name, const_value=ir.tensor(array, name=name), shape=ir.Shape(array.shape),
                     type=ir.TensorType(ir.DataType.INT64))
    graph.register_initializer(value)
    return value


def _model(x_shape: list, first: list[int], second: list[int], allowzero: tuple[int, int] = (0, 0)) -> ir.Model:
    """y = Reshape(Reshape(x, first), second) followed by an Identity, so the pair is not the graph output."""
    x = ir.Value(name="x", shape=ir.Shape(x_shape), type=ir.TensorType(ir.DataType.FLOAT))
    graph = ir.Graph([x], [], nodes=[], opset_imports={"": 21}, name="g")
    a, b = _const(graph, "a", first), _const(graph, "b", second)
    inner = ir.node("Reshape", [x, a], attributes={"allowzero": allowzero[0]})
    inner.outputs[0].name = "middle"
    outer = ir.node("Reshape", [inner.outputs[0], b], attributes={"allowzero": allowzero[1]})
    outer.outputs[0].name = "reshaped"
    last = ir.node("Identity", [outer.outputs[0]])
    last.outputs[0].name, last.outputs[0].type = "y", ir.TensorType(ir.DataType.FLOAT)
    for node in (inner, outer, last):
        graph.append(node)
    graph.outputs.append(last.outputs[0])
    return ir.Model(graph, ir_version=10)


def _run(model: ir.Model, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _reshapes(model: ir.Model) -> list[ir.Node]:
    used = [n for n in model.graph if n.op_type == "Reshape"]
    return [n for n in used if n.outputs[0].uses() or n.outputs[0].is_graph_output()]


def test_a_split_and_merge_of_the_last_axis_disappears():
    # the pattern the fusions leave around RotaryEmbedding / GroupQueryAttention: [b, s, h*d] -> [b, s, h, d] -> back
    model = _model([2, 5, 6], [0, 0, 2, 3], [0, 0, -1])
    x = np.random.default_rng(0).standard_normal((2, 5, 6)).astype(np.float32)
    expected = _run(model, x)
    assert collapse_reshapes(model) == 2  # the pair merges, then the merged reshape keeps x's shape
    assert not _reshapes(model)
    np.testing.assert_array_equal(_run(model, x), expected)


def test_a_zero_that_would_copy_a_changed_dimension_blocks_the_merge():
    # Reshape([2, 6] -> [3, 4]) then [0, -1]: the 0 copies the intermediate's 3, which is not x's 2
    model = _model([2, 6], [3, 4], [0, -1])
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    expected = _run(model, x)
    assert expected.shape == (3, 4)
    assert collapse_reshapes(model) == 0
    assert len(_reshapes(model)) == 2
    np.testing.assert_array_equal(_run(model, x), expected)


def test_with_allowzero_the_outer_sizes_are_literal_and_the_pair_merges():
    # torch's exporter writes allowzero=1: the outer target is sizes, whatever the intermediate is
    model = _model([2, 6], [3, 4], [4, 3], allowzero=(1, 1))
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    expected = _run(model, x)
    assert collapse_reshapes(model) == 1
    outer = _reshapes(model)
    assert len(outer) == 1 and outer[0].inputs[0].name == "x"
    np.testing.assert_array_equal(_run(model, x), expected)
