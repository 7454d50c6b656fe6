"""ONNX: a 64-bit integer ``sum`` becomes a ``CumSum`` whose last element is taken, exact as torch's.

ONNX Runtime's CPU ``ReduceSum`` accumulates int64 through a floating-point type: eight values of ``2**53 + 1``
sum to ``72057594037927936`` (torch: ``...944``), and a sum past the int64 range saturates where torch wraps.
BLT's n-gram hash (``rolling_polynomial_hash``: ``sum(tokens * prime ** i)``, wrapping, then ``% vocab``) picked
other hash embeddings for every token (logits off by 5.2). ``CumSum`` adds in int64 exactly (and wraps as torch
does), so each reduced axis is padded with one zero (an empty axis still sums to 0), accumulated, and its last
element kept. Other dtypes go to torchlib's own conversion. Drop it once ONNX Runtime's ReduceSum adds int64 in
int64. Not rewritten: ONNX Runtime's int64 ``Pow`` goes through double too (``1000000007 ** 2`` gives
``...014000000000``, torch ``...014000000049``); BLT's powers of its fixed group size fold to constants at export.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["integer_sum", "integer_sum_all"]


def _is_64bit_int(value: Any) -> bool:
    from onnxscript import ir

    return getattr(value, "dtype", None) in (ir.DataType.INT64, ir.DataType.UINT64)


def integer_sum(self: Any, dim: Any = None, keepdim: bool = False, dtype: int = -1) -> Any:
    """``aten.sum.dim_IntList``: a CumSum per reduced axis for 64-bit integers, torchlib's ReduceSum otherwise."""
    from onnxscript.function_libs.torch_lib.ops.core import aten_sum_dim_IntList
    from onnxscript.onnx_opset import opset18 as op

    shape = getattr(self, "shape", None)
    if shape is None or len(shape) == 0 or not _is_64bit_int(self) or dtype not in (-1, None):
        return aten_sum_dim_IntList(self, dim, keepdim, dtype)
    rank = len(shape)
    dims = range(rank) if dim is None or (not isinstance(dim, int) and len(dim) == 0) else \
        [dim] if isinstance(dim, int) else dim
    axes = sorted({int(d) % rank for d in dims})
    total = self
    for axis in axes:
        one = op.Constant(value_ints=[axis])
        padded = op.Pad(total, op.Constant(value_ints=[0, 1]), None, one)  # one zero at the axis' end
        running = op.CumSum(padded, op.Constant(value_int=axis))
        total = op.Slice(running, op.Constant(value_ints=[-1]), op.Constant(value_ints=[2**63 - 1]), one)
    return total if keepdim else op.Squeeze(total, op.Constant(value_ints=axes))


def integer_sum_all(self: Any, dtype: int = -1) -> Any:
    """``aten.sum.default``: every axis (see :func:`integer_sum`)."""
    from onnxscript.function_libs.torch_lib.ops.core import aten_sum

    if not _is_64bit_int(self) or dtype not in (-1, None) or not getattr(self, "shape", None):
        return aten_sum(self, dtype)
    return integer_sum(self, None, False)


@workaround(
    id="onnx-integer-sum",
    backend="onnx",
    target="onnxruntime ReduceSum (CPU) on int64",
    breaks="an int64 sum loses precision past 2**53 and saturates where torch wraps: BLT's n-gram hash embeddings "
    "(logits off by 5.2)",
    upstream="ONNX Runtime CPU ReduceSum kernel (int64 accumulated in floating point); no issue known",
    versions={"onnxruntime": ">=1.20,<1.33"},
)
def _apply(model: Any, inputs: dict):
    import torch

    from ..backends.onnx.translations import register_translation

    undo_dims = register_translation(torch.ops.aten.sum.dim_IntList, integer_sum)
    undo_all = register_translation(torch.ops.aten.sum.default, integer_sum_all)

    def undo() -> None:
        undo_all()
        undo_dims()

    return undo
