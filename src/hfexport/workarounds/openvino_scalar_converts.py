"""OpenVINO: fold the scalar ``Convert`` the PyTorch frontend leaves unfoldable, so the CPU plugin fuses RoPE and
its stateful attention on the model as converted, not only after a save and reload.

The frontend translates ``aten.neg`` (rotary's ``rotate_half``) as ``Multiply(x, ConvertLike(-1))`` and marks the
scalar's ``Convert`` ``DisableConstantFolding`` and the ``Multiply`` a dequantization node. These marks live in the
in-memory model's runtime info only: ``ov.save_model`` does not write them. So the same IR compiles two ways
(openvino 2026.3.1, CPU): read back from disk, the plugin folds the ``-1``, matches its RoPE pattern and then fuses
each layer's ``ReadValue -> Concat -> SDPA -> Assign`` into ``ScaledDotProductAttentionWithKVCache`` (the cache
appended in place); compiled straight from ``convert_model``'s output (``export()`` then ``generate()`` without a
save) it fuses no RoPE (a two-layer Llama: 0 ``RoPE`` nodes against 4), and, for a graph traced on an unpadded
batch-1 prompt (no mask input: SmolLM2's shapes, two layers), no stateful attention either (7 ``Concat`` against 3).

This wraps ``openvino.convert_model`` to replace every ``Convert`` of a one-element ``Constant`` by the converted
``Constant``: a scalar costs nothing to fold, and weight-decompression ``Convert`` nodes (whole tensors) are left as
they are. Drop it once the frontend stops marking the scalar (``tests/models/test_generate_openvino.py``'s
growing-cache test fails without this).
"""

from __future__ import annotations

from typing import Any

from .openvino_convert import rewrite_model_after_convert
from .registry import workaround

__all__ = ["fold_scalar_converts"]


def fold_scalar_converts(model: Any) -> int:
    """Replace each ``Convert`` of a one-element ``Constant`` in ``model`` by a ``Constant`` (in place); returns how
    many."""
    import numpy as np
    import openvino.opset13 as ops

    count = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "Convert" or node.get_input_size() != 1:
            continue
        source = node.input_value(0).get_node()
        if source.get_type_name() != "Constant" or int(np.prod(source.get_output_shape(0))) != 1:
            continue
        target = node.get_output_element_type(0)
        if not target.is_static() or target.to_dtype() is None:
            continue
        value = np.asarray(source.get_data()).astype(target.to_dtype())
        folded = ops.constant(value, target)
        for consumer in list(node.output(0).get_target_inputs()):
            consumer.replace_source_output(folded.output(0))
        count += 1
    if count:
        model.validate_nodes_and_infer_types()
    return count


@workaround(
    id="openvino-scalar-converts",
    backend="openvino",
    target="OpenVINO PyTorch frontend: aten.neg as Multiply(x, ConvertLike(-1)) marked DisableConstantFolding",
    breaks="the model as converted (not yet saved) compiles without the CPU plugin's RoPE and stateful SDPA "
    "fusions (ScaledDotProductAttentionWithKVCache): a growing-cache decode keeps its Concat and Transposes per layer",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_model_after_convert(fold_scalar_converts)
