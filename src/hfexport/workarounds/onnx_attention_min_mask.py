"""ONNX: an SDPA float mask's ``finfo(dtype).min`` entries are moved one step towards zero before conversion.

Models that build their own additive masks fill the masked keys with ``torch.finfo(dtype).min`` (Doge's dynamic
mask, eager-style masks). torch adds the mask to the scores and takes the softmax: a query row whose every key holds
that value (a left-padded row) gets equal weights, the mean of the values. ONNX Runtime's CPU kernel of the
opset-23 ``Attention`` reads exactly ``finfo(float32).min`` as "masked" and returns zeros for such a row (any other
value, -3e38 included, gives torch's mean): Doge's left-padded positions differed by 0.96 in the next layer's keys.
The value one float step above ``min`` gives the same softmax as ``min`` everywhere (its exponential underflows to
0 against any other key, and a row of it alone is uniform), so each SDPA's float mask gets its ``min`` entries
replaced by it (one ``Where`` per mask, shared by the SDPAs that read it); ``-inf`` stays ``-inf`` (a row of ``-inf``
is zeros in both). Drop it once ONNX Runtime adds such a mask as the operator's specification says.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["lift_min_masks"]

def lift_min_masks(program: Any) -> int:
    """Replace ``finfo(dtype).min`` in the float ``attn_mask`` of every SDPA of ``program`` by the next float towards
    zero, in place; returns how many SDPAs read a lifted mask."""
    from ..capture.graph_passes import rewrite_nodes

    lifted: dict[Any, Any] = {}  # mask node -> its lifted node (one per mask, whatever reads it)
    return rewrite_nodes(program, lambda graph, node: _lift(graph, node, lifted))


def _lift(graph: Any, node: Any, lifted: dict[Any, Any]) -> bool:
    import torch

    from ..capture.graph_passes import call_with_value, traced
    from .onnx_attention_mask_rows import sdpa_mask, set_sdpa_mask

    if node.target is not torch.ops.aten.scaled_dot_product_attention.default:
        return False
    mask_node = sdpa_mask(node)
    mask = traced(mask_node)
    if not isinstance(mask_node, torch.fx.Node) or not isinstance(mask, torch.Tensor) \
            or not mask.dtype.is_floating_point:
        return False
    if mask_node not in lifted:
        low = torch.finfo(mask.dtype).min
        above = torch.nextafter(torch.tensor(low, dtype=mask.dtype), torch.tensor(0.0, dtype=mask.dtype)).item()
        aten = torch.ops.aten
        with graph.inserting_before(node):
            at_min = call_with_value(graph, aten.eq.Scalar, (mask_node, low), mask.eq(low))
            lifted[mask_node] = call_with_value(graph, aten.masked_fill.Scalar, (mask_node, at_min, above), mask)
    set_sdpa_mask(node, lifted[mask_node])
    return True


@workaround(
    id="onnx-attention-min-mask",
    backend="onnx",
    target="onnxruntime Attention (opset 23) CPU kernel: attn_mask entries equal to finfo(float32).min",
    breaks="a float SDPA mask that fills a whole query row with finfo(dtype).min (a left-padded row of Doge's "
    "dynamic mask) gives zeros on ONNX Runtime where torch gives the mean of the values (0.96 in Doge's next keys)",
    upstream="ONNX Runtime CPU kernel of the ONNX Attention op (opset 23); no issue known",
    versions={"onnxruntime": ">=1.20,<1.33"},
)
def _apply(model: Any, inputs: dict):
    from ..backends.onnx.translations import around_decomposition

    return around_decomposition(before=lift_min_masks)
