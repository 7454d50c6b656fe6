"""OpenVINO CPU: no implicit broadcast in an element-wise op on the output of ``ScaledDotProductAttention``.

The CPU plugin's Snippets tokenizer fuses an attention op (decomposed to MatMul-Softmax-MatMul) and the element-wise
ops after it into one MHA ``Subgraph``. When a fused op broadcasts along the head dimension (a ``[B, 1, S, 1]``
operand against the ``[B, H, S, D]`` output) and the head size is 128 or more, the fused kernel returns wrong
numbers: max abs diff 3.1 (head size 128) and 3.6 (256) against torch for a lone SDPA followed by
``select(mask.any(-1), out, 0)``, exact (5e-7) at head size 64 and with ``SNIPPETS_MODE=DISABLE`` (openvino 2026.3.1,
AVX-512 CPU; ``benchmarks/openvino_mha_postop_repro.py`` prints it). The fully-masked-row fix
(``openvino_sdpa_masked_rows``) puts exactly such a ``Select`` there, so Llama/Qwen2 at head size 128 and Gemma-3 at
256 decoded wrong logits (max abs diff 1.4-2.7 on a random-weight one-layer model).

This wraps ``openvino.convert_model`` to broadcast, explicitly and ahead of the op, every operand of an element-wise
consumer of an attention output that would broadcast against it (a ``Broadcast`` to the output's shape; scalars and
all-ones shapes stay as they are): the fused op then broadcasts nothing and is exact, static shapes (520 tokens,
head 256) and dynamic ones alike. A no-op ``Reshape`` fence in front of the consumer was tried first: it fixes
dynamic shapes but constant folding removes it from static ones. The cost is one boolean ``[B, H, S, D]`` tensor per
attention layer. Drop it once the Snippets MHA post-op broadcast is fixed upstream (the head-size-256 OpenVINO test
in ``tests/models/test_openvino_real_sizes.py`` says when: it fails without this).
"""

from __future__ import annotations

from typing import Any

from .openvino_convert import rewrite_model_after_convert
from .registry import workaround

__all__ = ["broadcast_attention_postop_operands"]

#: consumer ops Snippets tokenizes into an MHA ``Subgraph`` as post-ops (element-wise, unary or binary)
_ELEMENTWISE = frozenset({
    "Add", "Subtract", "Multiply", "Divide", "Select", "Maximum", "Minimum", "Power", "SquaredDifference",
    "Convert", "Relu", "Sigmoid", "Tanh", "Swish", "Gelu", "HSwish", "Clamp", "Exp", "Abs", "Negative", "Sqrt",
    "Erf", "Elu", "Mish", "SoftPlus", "PRelu", "Round", "Floor", "Ceiling", "FakeQuantize", "LogicalAnd",
    "LogicalOr", "LogicalNot", "Equal", "NotEqual", "Greater", "GreaterEqual", "Less", "LessEqual",
})


def _broadcasts(operand: Any, out: Any) -> bool:
    shape = operand.get_partial_shape()
    if shape.rank.is_dynamic:
        return True
    if all(dim.is_static and dim.get_length() == 1 for dim in shape):
        return False
    return shape != out.get_partial_shape()


def broadcast_attention_postop_operands(model: Any) -> int:
    """Rewrite ``model`` (an ``openvino.Model``) in place; returns how many operands were broadcast explicitly."""
    import openvino.opset13 as ops

    count = 0
    for node in model.get_ordered_ops():
        if node.get_type_name() != "ScaledDotProductAttention":
            continue
        out = node.output(0)
        shape = None
        for consumer in list(out.get_target_inputs()):
            op = consumer.get_node()
            if op.get_type_name() not in _ELEMENTWISE:
                continue
            for port in range(op.get_input_size()):
                operand = op.input_value(port)
                if operand == out or not _broadcasts(operand, out):
                    continue
                shape = shape if shape is not None else ops.shape_of(out)
                op.input(port).replace_source_output(ops.broadcast(operand, shape).output(0))
                count += 1
    if count:
        model.validate_nodes_and_infer_types()
    return count


@workaround(
    id="openvino-mha-postops",
    backend="openvino",
    target="OpenVINO CPU Snippets MHA tokenization (ScaledDotProductAttention + broadcasting element-wise op)",
    breaks="an element-wise op that broadcasts over the head dimension after SDPA is fused into the MHA Subgraph "
    "and computes wrong numbers for head sizes >= 128 (Llama/Qwen2 head 128, Gemma-3 head 256: logits off by 1.4-2.7)",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_model_after_convert(broadcast_attention_postop_operands)
