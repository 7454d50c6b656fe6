"""Edge lowering and the ExecuTorch program: ``to_edge_transform_and_lower`` -> ``to_executorch``.

The memory-planning pass honours ``ExecutorchConfig``'s alloc flags: with ``alloc_graph_input=False`` the runtime
reads the caller's input buffers (an in-place cache write lands in them), with ``alloc_graph_output=False`` the
caller binds the output buffers (``Method::set_output_data_ptr``, the C++ zero-copy decode loop). Each phase is
timed and logged, so a slow export says where its time went.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from ...capture.graph_passes import drop_tensor_checks, fold_split_cat
from ...configs import ExecutorchConfig
from .bounds import cap_dynamic_dims, cap_late_reads
from .targets import Target
from .weights import DATA_TAG, tag_weights_external

__all__ = ["lower", "backend_config"]

logger = logging.getLogger(__name__)


def backend_config(config: ExecutorchConfig, external: bool = False, quant_fusion: bool = False) -> Any:
    """The ``ExecutorchBackendConfig`` of ``to_executorch``: a memory-planning pass with the config's alloc flags;
    ``external``: every program constant to the ``.ptd`` (see :mod:`.weights`); ``quant_fusion``: ExecuTorch's
    quant fusion pass (torchao's ``dequantize_affine`` + ``embedding`` -> ``quantized_decomposed::embedding_byte`` /
    ``embedding_4bit``, which have kernels; torchao's op has none)."""
    from executorch.exir import ExecutorchBackendConfig
    from executorch.exir.passes import MemoryPlanningPass
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

    class BoundedSymShapeEval(ConstraintBasedSymShapeEvalPass):  # (see bounds.cap_late_reads)
        def call(self, graph_module: Any) -> Any:
            cap_late_reads(graph_module)
            return super().call(graph_module)

    return ExecutorchBackendConfig(
        memory_planning_pass=MemoryPlanningPass(
            alloc_graph_input=config.alloc_graph_input,
            alloc_graph_output=config.alloc_graph_output,
            alloc_mutable_buffers=config.alloc_mutable_buffers,
        ),
        sym_shape_eval_pass=BoundedSymShapeEval(),
        emit_mutable_buffer_names=True,  # a cache kept as state is reached by name (Method.get_attribute)
        external_constants=(lambda node: DATA_TAG) if external else False,
        do_quant_fusion_and_const_prop=quant_fusion,
    )


def lower(
    program: torch.export.ExportedProgram, config: ExecutorchConfig, target: Target, model: Any,
    timings: dict[str, float] | None = None, external: bool = False,
) -> Any:
    """Lower a traced program for ``target`` and build its ``ExecutorchProgramManager``; ``external``: its weights
    in one ``.ptd`` (a tied weight stored once, see :mod:`.weights`)."""
    import executorch.kernels.quantized  # noqa: F401  (the out variants of quantized_decomposed ops left outside
    from executorch.exir import to_edge_transform_and_lower  # a delegate, e.g. an int8 embedding's dequantize)

    timings = {} if timings is None else timings
    fold_split_cat(program)  # (a multimodal model's per-image split of its features, concatenated again)
    drop_tensor_checks(program)
    target.rewrite(program)
    cap_dynamic_dims(program)
    if external:
        tag_weights_external(program)
    start = time.perf_counter()
    edge = to_edge_transform_and_lower(
        program,
        partitioner=target.partitioners(model, program),
        compile_config=target.compile_config(),
        transform_passes=target.transform_passes(),
    )
    timings["to_edge_and_lower"] = time.perf_counter() - start
    start = time.perf_counter()
    # torchao quantize/dequantize ops left outside a delegate (a torchao-quantized embedding): quant fusion
    manager = edge.to_executorch(config=backend_config(config, external, quant_fusion=_torchao_ops_left(edge)))
    timings["to_executorch"] = time.perf_counter() - start
    logger.info("ExecuTorch lowering (%s): %s", target.name, ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
    return manager


def _torchao_ops_left(edge: Any) -> bool:
    """Whether the lowered edge program calls a ``torchao`` op outside its delegates."""
    graph = edge.exported_program().graph
    return any(n.op == "call_function" and "torchao" in str(n.target) for n in graph.nodes)
