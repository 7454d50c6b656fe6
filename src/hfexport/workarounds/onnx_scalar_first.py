"""ONNX: an arithmetic node whose first operand is a Python number (``1.0 - x`` as decomposed) gets it as a 0-d tensor.

torchlib leaves ``aten::rsub`` unregistered on purpose ("It will be decomposed and type promoted by torch",
onnxscript/function_libs/torch_lib/ops/core.py): ``rsub(x, 1.0)`` decomposes to ``aten.sub.Tensor(1.0, x)``, a number
in the ``self`` slot. Where torch.onnx's type promotion pass (``_fx_passes.insert_type_promotion_nodes``) then casts
``x``, it looks the overload up again for ``(float, Tensor)`` and finds none: "Cannot find a compatible OpOverload for
aten.sub with the provided arguments" (TimesFM's ``patched_inputs * (1.0 - patched_pads)``, ProphetNet, XLNet).
Before that pass, the number becomes an ``aten.scalar_tensor`` node of the other operand's dtype (the default float
dtype for a float number and an integer tensor, as torch promotes), the same value on the same side: torch computes
the same result, bit for bit. Drop it once the type promotion pass accepts a number as ``self``.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["tensor_first_operands"]

_FX_PASSES = "torch.onnx._internal.exporter._fx_passes"


def tensor_first_operands(graph_module: Any) -> int:
    """Give every binary ``aten`` arithmetic node of ``graph_module`` (and its submodules) whose first operand is a
    Python number a 0-d tensor of it instead; returns how many nodes changed."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(graph_module, _tensor_first)


def _tensor_first(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import traced

    aten = torch.ops.aten
    if node.target not in (aten.sub.Tensor, aten.add.Tensor, aten.mul.Tensor, aten.div.Tensor) or len(node.args) < 2:
        return False
    number, value = node.args[0], traced(node.args[1])
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not isinstance(value, torch.Tensor):
        return False
    dtype = value.dtype
    if isinstance(number, float) and not (dtype.is_floating_point or dtype.is_complex):
        dtype = torch.get_default_dtype()
    with graph.inserting_before(node):
        scalar = graph.call_function(aten.scalar_tensor.default, (number,), {"dtype": dtype})
    scalar.meta["val"] = torch.empty((), dtype=dtype, device=value.device)
    node.args = (scalar, *node.args[1:])
    return True


@workaround(
    id="onnx-scalar-first-operand",
    backend="onnx",
    target=f"{_FX_PASSES}.insert_type_promotion_nodes (a number as aten.sub's self, from rsub's decomposition)",
    breaks="1.0 - x with a cast x (TimesFM, ProphetNet, XLNet) does not convert: 'Cannot find a compatible "
    "OpOverload for aten.sub with the provided arguments'",
    upstream=None,
    versions={"torch": ">=2.9,<2.14"},
)
def _apply(model: Any, inputs: dict):
    from ..backends.onnx.translations import around_type_promotion

    return around_type_promotion(before=tensor_first_operands)
