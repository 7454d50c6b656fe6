"""ONNX translations of ops torchlib has none for, passed to ``torch.onnx.export`` as ``custom_translation_table``.

- ``transformers::grouped_mm_fallback`` (and ``aten::_grouped_mm``): the MoE experts' grouped matmul of
  transformers' ``grouped_mm`` experts implementation. Rows arrive sorted by expert with ``offs`` the cumulative
  row count per expert; the number of experts is static, so it unrolls into one ``MatMul`` per expert over its
  ``Slice`` of rows, then a ``Concat``. The weights are split once (folded by ONNX Runtime at load), and no
  ``[rows, in, out]`` gather of expert weights is materialised.
- ``aten::sym_numel`` (a tensor's ``numel()`` read as a size, Muse Spark's vision tower after an eager run of the
  model): ONNX's ``Size``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["translation_table", "register_translation", "around_decomposition", "around_type_promotion"]

_FX_PASSES = "torch.onnx._internal.exporter._fx_passes"
# op -> (translation, lowest opset it is valid for): added for the length of an export by registered workarounds
_OVERRIDES: dict[Any, tuple[Any, int]] = {}


def register_translation(op: Any, translation: Any, min_opset: int = 1) -> Any:
    """Use ``translation`` for ``op`` in the exports that follow (from ``min_opset`` on); returns the undo."""
    previous = _OVERRIDES.get(op)
    _OVERRIDES[op] = (translation, min_opset)

    def undo() -> None:
        if previous is None:
            _OVERRIDES.pop(op, None)
        else:
            _OVERRIDES[op] = previous

    return undo


def around_decomposition(before: Any = None, after: Any = None) -> Any:
    """Run ``before(program)`` on each program ``torch.onnx`` is about to decompose for ONNX (its re-trace with the
    decomposition table) and ``after(program)`` on the decomposed one, in the exports that follow; returns the undo."""
    import importlib

    from ...workarounds.registry import patch_attribute

    module = importlib.import_module(_FX_PASSES)
    original = module.decompose_with_registry

    def decompose_with_registry(exported_program: Any, registry: Any) -> Any:
        if before is not None:
            before(exported_program)
        decomposed = original(exported_program, registry)
        if after is not None:
            after(decomposed)
        return decomposed

    return patch_attribute(module, "decompose_with_registry", decompose_with_registry)


def around_type_promotion(before: Any = None, after: Any = None) -> Any:
    """Run ``before(graph_module)`` / ``after(graph_module)`` around torch.onnx's type promotion pass
    (``_fx_passes.insert_type_promotion_nodes``, after its decomposition) in the exports that follow; returns the
    undo."""
    import importlib

    from ...workarounds.registry import patch_attribute

    module = importlib.import_module(_FX_PASSES)
    original = module.insert_type_promotion_nodes

    def insert_type_promotion_nodes(graph_module: Any) -> None:
        if before is not None:
            before(graph_module)
        original(graph_module)
        if after is not None:
            after(graph_module)

    return patch_attribute(module, "insert_type_promotion_nodes", insert_type_promotion_nodes)


def _grouped_mm(mat_a: Any, mat_b: Any, offs: Any, bias: Any = None, out_dtype: Any = None) -> Any:
    from onnxscript.onnx_opset import opset18 as op

    experts = mat_b.shape[0]
    if not isinstance(experts, int):
        raise ValueError("grouped_mm: the number of experts (weight.shape[0]) must be static")
    axis0 = op.Constant(value_ints=[0])
    ends = op.Split(op.Cast(offs, to=7), axis=0, num_outputs=experts) if experts > 1 else [op.Cast(offs, to=7)]
    weights = op.Split(mat_b, axis=0, num_outputs=experts) if experts > 1 else [mat_b]
    biases = (op.Split(bias, axis=0, num_outputs=experts) if experts > 1 else [bias]) if bias is not None else None
    start = op.Constant(value_ints=[0])
    outputs = []
    for g in range(experts):
        rows = op.Slice(mat_a, start, ends[g], axis0)
        out = op.MatMul(rows, op.Squeeze(weights[g], axis0))
        if biases is not None:
            out = op.Add(out, op.Squeeze(biases[g], axis0))
        outputs.append(out)
        start = ends[g]
    return op.Concat(*outputs, axis=0) if experts > 1 else outputs[0]


def _sym_numel(self: Any) -> Any:
    """``aten.sym_numel``: the element count as torchlib gives a size (an int64 scalar), ONNX's ``Size``."""
    from onnxscript.onnx_opset import opset18 as op

    return op.Size(self)


def translation_table(opset: int) -> dict[Any, Any]:
    """``{torch op: onnxscript translation}`` for the ops loaded in this process, at ``opset``."""
    table: dict[Any, Any] = {op: fn for op, (fn, min_opset) in _OVERRIDES.items() if opset >= min_opset}
    grouped = getattr(torch.ops.aten, "_grouped_mm", None)
    if grouped is not None and hasattr(grouped, "default"):
        table.setdefault(grouped.default, _grouped_mm)
    table.setdefault(torch.ops.aten.sym_numel.default, _sym_numel)
    namespace = getattr(torch.ops, "transformers", None)
    fallback = getattr(namespace, "grouped_mm_fallback", None) if namespace is not None else None
    if fallback is not None:
        table.setdefault(fallback.default, _grouped_mm)
    return table
