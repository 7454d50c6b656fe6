"""Block-wise int4 / int8 weights for ONNX Runtime's CPU kernels: ``MatMulNBits`` and ``GatherBlockQuantized``.

ONNX Runtime's ``MatMulNBitsQuantizer`` does the quantization. What it does not do, and this module does by hand:

- A tied lm_head reads the embedding table transposed: through a ``Transpose`` (the optimiser does not fold a
  constant that large), or, after the ORT fusions, as ``FusedMatMul(transB=1)``. The quantizer takes only a plain
  ``MatMul`` with a constant weight, so it would skip the largest matrix of a small model (SmolLM2-135M: 28M of 135M
  parameters), left fp32 and read in full at every decode step. :func:`_materialize_transposed_weights` makes it a
  ``MatMul`` with the transposed matrix as its own initializer first.
- At 8 bits the quantizer leaves embedding ``Gather`` s float ("Gather only supports 4 bits"): they get int8 per row
  (:func:`~.onnx_weights.int8_weight_only`) and a lookup that dequantizes only the gathered rows
  (:func:`~.onnx_gather.gather_before_dequantize`).
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from .base import quantizer_workarounds

__all__ = ["quantize_nbits", "load_in_memory"]

logger = logging.getLogger(__name__)


def quantize_nbits(model: Any, config: Any) -> Any:
    """``model`` (an ``onnx_ir.Model``) with its ``MatMul`` / embedding ``Gather`` weights quantized as ``config`` (an
    ``OnnxRuntimeWeightOnlyConfig``) says; a new model, ``model`` is left as it was."""
    with quantizer_workarounds(["onnxruntime-nbits-root-logging"], model):
        return _quantize_nbits(model, config)


def _algorithm(config: Any, bits: int, algorithm: str, gather: bool) -> Any:
    """ONNX Runtime's quantization config for one pass."""
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, HQQWeightOnlyQuantConfig
    from onnxruntime.quantization.quant_utils import QuantFormat

    quant_axes = (("MatMul", 0), ("Gather", 1))
    if algorithm == "HQQ":
        return HQQWeightOnlyQuantConfig(
            block_size=config.block_size, bits=bits, op_types_to_quantize=("MatMul",), quant_axes=quant_axes
        )
    return DefaultWeightOnlyQuantConfig(
        block_size=config.block_size, is_symmetric=config.is_symmetric, accuracy_level=config.accuracy_level,
        quant_format=QuantFormat.QOperator, op_types_to_quantize=("MatMul", "Gather") if gather else ("MatMul",),
        quant_axes=quant_axes, bits=bits,
    )


def _quantize_nbits(model: Any, config: Any) -> Any:
    import onnx_ir as ir
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    from .onnx_gather import gather_before_dequantize
    from .onnx_offsets import split_float_zero_points
    from .onnx_weights import int8_weight_only, nodes_in_modules

    op_types = tuple(config.op_types_to_quantize)
    excluded = list(config.nodes_to_exclude or [])
    # ONNX Runtime quantizes an embedding at 4 bits only, and HQQ none: the others go int8 per row below
    int4_gather = "Gather" in op_types and config.bits == 4 and config.algorithm == "DEFAULT"
    with tempfile.TemporaryDirectory() as tmp:
        # through files with external data: a model past protobuf's 2 GB limit works too
        source, target = Path(tmp, "model.onnx"), Path(tmp, "quantized.onnx")
        copy = model.clone() if hasattr(model, "clone") else ir.from_proto(ir.to_proto(model))
        transposed = _materialize_transposed_weights(copy) if "MatMul" in op_types else 0
        backup = [n for n in nodes_in_modules(copy, config.int8_modules, ("MatMul",)) if n not in excluded]
        ir.save(copy, source, external_data="model.onnx.data")
        del copy
        passes = [(config.bits, config.algorithm, excluded + backup, None, int4_gather)]
        if backup and config.bits != 8:
            passes.append((8, "DEFAULT", excluded, backup, False))
        for bits, algorithm, exclude, include, gather in passes:
            if "MatMul" not in op_types and not gather:
                continue
            quantizer = MatMulNBitsQuantizer(str(source), nodes_to_exclude=exclude, nodes_to_include=include,
                                             algo_config=_algorithm(config, bits, algorithm, gather))
            quantizer.process()
            quantizer.model.save_model_to_file(str(target), use_external_data_format=True)
            source, target = target, source
        quantized = ir.load(source)
        load_in_memory(quantized)  # before the temporary directory goes
    if config.split_zero_points:
        split_float_zero_points(quantized)
    if config.accuracy_level is not None:  # HQQ's config takes none
        for node in quantized.graph:
            if node.op_type == "MatMulNBits" and "accuracy_level" not in node.attributes:
                node.attributes["accuracy_level"] = ir.AttrInt64("accuracy_level", config.accuracy_level)
    if "Gather" in op_types and not int4_gather:
        int8_weight_only(quantized, [n.name for n in quantized.graph if n.op_type == "Gather" and n.name
                                     and n.name not in excluded])
        gather_before_dequantize(quantized)
    counts = {op: sum(1 for n in quantized.graph if n.op_type == op) for op in ("MatMul", "MatMulNBits",
                                                                                 "GatherBlockQuantized")}
    logger.info("MatMulNBits %d-bit %s: %s (%d transposed weights materialised, %d int8 backup)", config.bits,
                config.algorithm, counts, transposed, len(backup))
    return quantized


def _transposed_source(node: Any) -> Any:
    """The 2-D float initializer ``node`` (a ``MatMul`` or ``FusedMatMul``) reads transposed as its weight, or
    ``None``."""
    if node.op_type == "FusedMatMul" and node.domain == "com.microsoft":
        attributes = {name: attribute.value for name, attribute in node.attributes.items()}
        plain = {"alpha": 1.0, "transA": 0, "transBatchA": 0, "transBatchB": 0}
        if attributes.get("transB", 0) != 1 or any(attributes.get(k, v) != v for k, v in plain.items()):
            return None
        source = node.inputs[1]
    elif node.op_type == "MatMul" and node.domain in ("", "ai.onnx"):
        producer = node.inputs[1].producer() if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if producer is None or producer.op_type != "Transpose" or producer.domain not in ("", "ai.onnx"):
            return None
        perm = producer.attributes["perm"].value if "perm" in producer.attributes else [1, 0]
        source = producer.inputs[0] if list(perm) == [1, 0] else None
    else:
        return None
    if source is None or source.const_value is None or len(source.const_value.shape) != 2:
        return None
    return source if source.const_value.dtype.name in ("FLOAT", "FLOAT16", "BFLOAT16") else None


def _materialize_transposed_weights(model: Any) -> int:
    """Each ``MatMul(x, Transpose(W))`` and ``FusedMatMul(x, W, transB=1)`` (a tied lm_head) with ``W`` a 2-D float
    initializer becomes ``MatMul(x, W_transposed)``, ``W_transposed`` an initializer of its own (``W`` stays for the
    embedding lookup). Returns how many."""
    import onnx_ir as ir

    graph = model.graph
    count = 0
    for node in list(graph):
        source = _transposed_source(node)
        if source is None:
            continue
        name = f"{source.name}_transposed"
        value = graph.initializers.get(name)
        if value is None:
            data = np.ascontiguousarray(source.const_value.numpy().T)
            value = ir.Value(name=name, shape=ir.Shape(data.shape), type=ir.TensorType(source.dtype),
                             const_value=ir.tensor(data, name=name))
            graph.register_initializer(value)
        matmul = ir.node("MatMul", [node.inputs[0], value], name=f"{node.name or 'matmul'}_transposed_weight",
                         metadata_props=dict(node.metadata_props))  # its module path (the lm_head's)
        graph.insert_before(node, matmul)
        matmul.outputs[0].type, matmul.outputs[0].shape = node.outputs[0].type, node.outputs[0].shape
        old = node.outputs[0]
        producer = node.inputs[1].producer() if node.op_type == "MatMul" else None
        output_name = old.name
        ir.convenience.replace_all_uses_with(old, matmul.outputs[0], replace_graph_outputs=True)
        graph.remove(node, safe=True)
        matmul.outputs[0].name = output_name  # the logits keep their name
        if producer is not None and not producer.outputs[0].uses() and not producer.outputs[0].is_graph_output():
            graph.remove(producer, safe=True)
        count += 1
    return count


def load_in_memory(model: Any) -> None:
    """Read every external tensor (initializers and ``Constant`` attributes) of ``model`` into memory."""
    import onnx_ir as ir

    ir.external_data.load_to_model(model)
    for graph in model.graphs():
        for node in graph:
            for name, attribute in node.attributes.items():
                value = attribute.value
                if attribute.type == ir.AttributeType.TENSOR and isinstance(value, ir.ExternalTensor):
                    node.attributes[name] = ir.AttrTensor(name, ir.Tensor(value.numpy(), dtype=value.dtype, name=value.name))
