"""ONNX: ``aten.mul.Scalar`` translated as ``aten.mul.Tensor`` (a Python number as ``other``, which it takes).

torchlib (onnxscript/function_libs/torch_lib/ops/core.py) registers ``aten::mul`` for ``mul.Tensor`` only, where
``add``, ``sub`` and ``div`` register their ``.Scalar`` overloads too, so a program whose decomposition leaves a
``mul.Scalar`` (a float cast then scaled by a number: SAM's and SAM-HQ's vision towers, GOT-OCR2, BROS, PP-Chart2Table,
PP-FormulaNet) fails to convert: "No ONNX function found for <OpOverload(op='aten.mul', overload='Scalar')>".
The node comes from torch.onnx's own type promotion pass (``_fx_passes.insert_type_promotion_nodes``, after the
decomposition), which rebuilds a ``mul`` of a cast tensor and a number as ``mul.Scalar``. ``mul.Tensor`` with a number
as ``other`` computes the same product (torch's own export writes it so): after that pass, each ``mul.Scalar`` of the
graph is retargeted. Drop it once torchlib registers ``aten::mul.Scalar``.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["mul_scalar_as_tensor"]


_FX_PASSES = "torch.onnx._internal.exporter._fx_passes"


def mul_scalar_as_tensor(graph_module: Any) -> int:
    """Retarget every ``aten.mul.Scalar`` node of ``graph_module`` (and its submodules) to ``aten.mul.Tensor``."""
    import torch

    from ..capture.graph_passes import rewrite_nodes

    def retarget(graph: Any, node: Any) -> bool:
        if node.target is not torch.ops.aten.mul.Scalar:
            return False
        node.target = torch.ops.aten.mul.Tensor
        return True

    return rewrite_nodes(graph_module, retarget)


@workaround(
    id="onnx-mul-scalar",
    backend="onnx",
    target=f"{_FX_PASSES}.insert_type_promotion_nodes (its mul.Scalar: torchlib registers mul.Tensor only)",
    breaks="a program with an aten.mul.Scalar (SAM, SAM-HQ, GOT-OCR2, BROS vision/text towers) does not convert: "
    "No ONNX function found for <OpOverload(op='aten.mul', overload='Scalar')>",
    upstream=None,
    versions={"onnxscript": "<=0.7.0"},
)
def _apply(model: Any, inputs: dict):
    from ..backends.onnx.translations import around_type_promotion

    return around_type_promotion(after=mul_scalar_as_tensor)
