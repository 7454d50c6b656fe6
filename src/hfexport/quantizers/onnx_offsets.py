"""Float zero points kept off ``MatMulNBits``' slow path: each block's offset as a small product of its own.

ONNX Runtime's ``MatMulNBits`` dequantizes ``w = (q - zero) * scale`` per block of ``block_size`` inputs. Its fast
CPU kernels (MLAS, int8 dot products with ``accuracy_level=4``) take integer zero points only; a float zero point,
which HQQ's solver writes and which keeps a weight that already sits on a 4-bit grid with float offsets (a
dequantized GGUF Q4_1, like the packaged SmolLM2) on that grid, runs a reference path about 50x slower (650 against
13 us per 576x1536 product, measured with ONNX Runtime 1.32 on this project's machines).

No ONNX Runtime pass rewrites that, so :func:`split_float_zero_points` does it by hand. With ``m`` the code in the
middle (8 for 4 bits)::

    x @ ((q - zero) * scale) = x @ ((q - m) * scale)  +  blocksum(x) @ ((m - zero) * scale)

The first term is ``MatMulNBits`` without zero points (its default zero point is ``m``: the fast symmetric kernel);
the second multiplies the sums of ``x`` over each block (``Reshape`` + ``ReduceSum``, one per input and block size,
shared by the products that read it) by an ``[in / block, out]`` float matrix of offsets, one row per block: a
thirty-second of the weight's elements at blocks of 32. Same numbers as the float-zero-point kernel up to float
rounding; measured on a 576x1536 product streamed from memory: 21 us fast kernel alone, 31 us with the offset
product, against 650 us with float zero points.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

__all__ = ["split_float_zero_points"]

logger = logging.getLogger(__name__)

_FLOATS = ("FLOAT", "FLOAT16", "BFLOAT16")


def _splittable(node: Any) -> tuple[int, int, int, int, np.ndarray, np.ndarray] | None:
    """``(bits, K, N, block_size, scales [N, K / block], zero points [N, K / block])`` of a ``MatMulNBits`` whose
    zero points are a float constant and whose input rank is known, or ``None``."""
    if node.op_type != "MatMulNBits" or node.domain != "com.microsoft" or len(node.inputs) < 4:
        return None
    scales, zero = node.inputs[2], node.inputs[3]
    if zero is None or zero.const_value is None or zero.const_value.dtype.name not in _FLOATS:
        return None
    if scales is None or scales.const_value is None:
        return None
    if any(value is not None for value in node.inputs[4:5]):  # g_idx: blocks are not contiguous runs of inputs
        return None
    attributes = {name: attribute.value for name, attribute in node.attributes.items()}
    bits, k, n, block = (int(attributes[a]) for a in ("bits", "K", "N", "block_size"))
    shape = node.inputs[0].shape
    if k % block or shape is None or len(shape) < 2:
        return None
    blocks = k // block
    return (bits, k, n, block, scales.const_value.numpy().reshape(n, blocks),
            zero.const_value.numpy().reshape(n, blocks))


def split_float_zero_points(model: Any) -> int:
    """Rewrite each ``MatMulNBits`` of ``model`` (an ``onnx_ir.Model``) with float zero points as the fast kernel
    without them plus the product of its input's block sums with the blocks' offsets (module docstring). Returns
    how many products were rewritten; the others (an input of unknown rank, ``K`` not a multiple of the block,
    ``g_idx``) keep their float zero points."""
    import onnx_ir as ir

    from .onnx_gather import add_initializer

    graph = model.graph
    block_sums: dict[tuple[int, int], Any] = {}  # (id of the input value, block size) -> its block sums
    count = 0
    for node in list(graph):
        found = _splittable(node)
        if found is None:
            continue
        bits, k, n, block, scales, zero = found
        source = node.inputs[0]
        middle = 2 ** (bits - 1)  # MatMulNBits' zero point when none is given
        offsets = np.ascontiguousarray(((middle - zero.astype(np.float32)) * scales.astype(np.float32)).T)
        offsets = offsets.astype(scales.dtype)
        name = node.name or f"matmul_nbits_{count}"
        if (id(source), block) not in block_sums:
            rank = len(source.shape)
            dims = np.array([0] * (rank - 1) + [k // block, block], dtype=np.int64)  # 0: keep that dimension
            shape = add_initializer(graph, f"{name}_blocks", dims)
            reshape = ir.node("Reshape", [source, shape], name=f"{name}_blocks")
            axes = add_initializer(graph, f"{name}_block_axis", np.array([-1], dtype=np.int64))
            reduce = ir.node("ReduceSum", [reshape.outputs[0], axes], attributes={"keepdims": 0},
                             name=f"{name}_block_sums")
            graph.insert_before(node, [reshape, reduce])
            block_sums[id(source), block] = reduce.outputs[0]
        attributes = {key: attribute.value for key, attribute in node.attributes.items()}
        inputs = [source, node.inputs[1], node.inputs[2], None, *node.inputs[4:]]
        while inputs[-1] is None:  # no trailing empty inputs
            inputs.pop()
        fast = ir.node("MatMulNBits", inputs, attributes=attributes, domain="com.microsoft",
                       name=f"{name}_symmetric", metadata_props=dict(node.metadata_props))
        table = add_initializer(graph, f"{name}_block_offsets", offsets)
        product = ir.node("MatMul", [block_sums[id(source), block], table], name=f"{name}_offsets")
        add = ir.node("Add", [fast.outputs[0], product.outputs[0]], name=f"{name}_plus_offsets")
        graph.insert_before(node, [fast, product, add])
        old, zero_value = node.outputs[0], node.inputs[3]
        add.outputs[0].type, add.outputs[0].shape = old.type, old.shape
        output_name = old.name
        ir.convenience.replace_all_uses_with(old, add.outputs[0], replace_graph_outputs=True)
        graph.remove(node, safe=True)
        add.outputs[0].name = output_name
        if not zero_value.uses() and zero_value.name in graph.initializers:
            del graph.initializers[zero_value.name]
        count += 1
    logger.info("MatMulNBits: %d products' float zero points split into block offsets (%d block sums)", count,
                len(block_sums))
    return count

