"""One fp32 matrix product for the projections that read the same activation (q/k/v, gate/up).

A decoder layer projects one normed hidden state several times: ``q_proj``, ``k_proj`` and ``v_proj`` read the
attention input, ``gate_proj`` and ``up_proj`` the MLP input. Converted from torch, each is its own ``MatMul`` over a
constant ``[out, in]`` weight (``transpose_b``), which the CPU plugin runs as its own ``FullyConnected``. At batch 1
a decode step is one matrix-vector product per weight, bound by how fast the weights stream from memory, and a small
product streams worse than a large one: SmolLM2-135M's ``[192, 576]`` k/v projections read at ~15 GB/s where its
``[3072, 576]`` product reads at ~33 GB/s (openvino 2026.3.1, 2 cores, ``PERF_COUNT``). The gate projection is also
fused with its SiLU, which moves it from the plugin's MLAS kernel (110 us) to its brgemm one (144 us).

The CPU plugin merges such projections itself (its ``QKVProjFusion`` / ``MLPFusion`` passes), but only where it
runs them in bf16/f16 or over int8/int4 weights, never for an fp32 export at fp32 precision, the one this library
runs by default. Nothing in OpenVINO's or NNCF's Python passes does it either, so :func:`fuse_projections` does it by
hand on the converted model: each group of ``MatMul`` nodes that read one output, with 2-D fp32 constant weights of
the same input width read by nothing else, becomes one ``MatMul`` over the weights concatenated along the output
axis, followed by a ``VariadicSplit`` that hands each consumer its columns. Each output element is the same dot
product over the same weight row, so the results are the kernel's own for each row; the weights are stored once,
concatenated (the ``.bin`` is the same size).

Measured on SmolLM2-135M (growing cache, stateful, fp32, PERF_COUNT, one decode step): the 211 FullyConnected
nodes took 18.4 ms, the 121 fused ones 16.9 ms.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import numpy as np

__all__ = ["fuse_projections"]

logger = logging.getLogger(__name__)


def _fusable_weight(matmul: Any) -> Any | None:
    """The ``Constant`` weight of ``matmul`` where it is a plain fp32 ``[out, in]`` matrix read with ``transpose_b``
    by this product only; ``None`` otherwise."""
    import openvino as ov

    if matmul.get_type_name() != "MatMul":
        return None
    attributes = matmul.get_attributes()
    if attributes.get("transpose_a") or not attributes.get("transpose_b"):
        return None
    weight = matmul.input_value(1)
    node = weight.get_node()
    if node.get_type_name() != "Constant" or node.get_element_type() != ov.Type.f32:
        return None
    if len(node.get_output_shape(0)) != 2 or len(weight.get_target_inputs()) != 1:
        return None  # a tied weight read elsewhere too (an embedding's Gather) would be stored twice
    if matmul.input_value(0).get_partial_shape().rank.is_dynamic:
        return None
    return node


def fuse_projections(model: Any) -> int:
    """Merge, in place, the fp32 ``MatMul`` nodes of ``model`` that read one output with constant weights of one
    input width (see the module docstring); returns how many groups were merged."""
    import openvino.opset13 as ops

    groups: dict[tuple[str, int, int], list[Any]] = defaultdict(list)
    for node in model.get_ordered_ops():
        weight = _fusable_weight(node)
        if weight is None:
            continue
        source = node.input_value(0)
        width = weight.get_output_shape(0)[1]
        groups[(source.get_node().get_name(), source.get_index(), width)].append(node)
    merged = 0
    for products in groups.values():
        if len(products) < 2:
            continue
        weights = [p.input_value(1).get_node() for p in products]
        rows = [w.get_output_shape(0)[0] for w in weights]
        matrix = np.concatenate([w.get_data() for w in weights], axis=0)
        fused = ops.matmul(products[0].input_value(0), ops.constant(matrix), False, True)
        fused.set_friendly_name(products[0].get_friendly_name() + "/fused_projections")
        split = ops.variadic_split(fused, ops.constant(np.int64(-1)), ops.constant(np.array(rows, dtype=np.int64)))
        for product, output in zip(products, split.outputs()):
            output.get_tensor().set_names(product.output(0).get_names())
            for target in list(product.output(0).get_target_inputs()):
                target.replace_source_output(output)
        merged += 1
    if merged:
        model.validate_nodes_and_infer_types()
        logger.info("OpenVINO: %d groups of projections reading one activation merged into one MatMul each", merged)
    return merged
