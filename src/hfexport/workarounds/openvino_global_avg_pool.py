"""OpenVINO: an ``avg_pool2d`` whose window covers the whole (static) input is converted as the mean it computes.

EfficientNet (and ALIGN's EfficientNet tower) pools its last features with ``nn.AvgPool2d(hidden_dim,
ceil_mode=True)``: a 1280-wide kernel over a 7x7 (or, in the matrix's tiny model, 1x1) map, which torch clips to the
input and averages. OpenVINO's ``AvgPool`` shape inference refuses a kernel larger than the padded input ("Kernel after
dilation has size (dim: 1280) larger than the data shape after padding (dim: 1)"), at compile time. Where the input's
spatial sizes are static, the padding is zero and the window covers them (the output is 1x1), the node becomes
``mean`` over the two spatial dims (keepdim), which is what torch computes there. Drop it once OpenVINO's ``AvgPool``
clips an oversized kernel as torch does.
"""

from __future__ import annotations

from typing import Any

from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["global_pools_as_means"]


def global_pools_as_means(program: Any) -> int:
    """Rewrite each ``aten.avg_pool2d`` of ``program`` whose window covers its whole static input as a spatial mean;
    returns how many."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _pool_as_mean)


def _pool_as_mean(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import traced

    aten = torch.ops.aten
    if node.target is not aten.avg_pool2d.default:
        return False
    value = traced(node.args[0])
    if not isinstance(value, torch.Tensor) or value.dim() not in (3, 4):
        return False
    kernel = node.args[1] if len(node.args) > 1 else node.kwargs.get("kernel_size")
    padding = node.args[3] if len(node.args) > 3 else node.kwargs.get("padding", 0)
    divisor = node.args[6] if len(node.args) > 6 else node.kwargs.get("divisor_override")
    kernel = [kernel, kernel] if isinstance(kernel, int) else list(kernel)
    padding = [padding, padding] if isinstance(padding, int) else list(padding or [0, 0])
    sizes = list(value.shape[-2:])
    if (divisor is not None or any(p != 0 for p in padding) or len(kernel) == 1
            or not all(isinstance(s, int) and k >= s for k, s in zip(kernel, sizes))):
        return False
    with graph.inserting_before(node):
        mean = graph.call_function(aten.mean.dim, (node.args[0], [-2, -1], True))
    mean.meta["val"] = node.meta.get("val")
    node.replace_all_uses_with(mean)
    graph.erase_node(node)
    return True


@workaround(
    id="openvino-global-avg-pool",
    backend="openvino",
    target="openvino.convert_model (aten.avg_pool2d whose kernel covers the whole input)",
    breaks="EfficientNet / ALIGN compile fails: 'Kernel after dilation has size (dim: 1280) larger than the data shape "
    "after padding (dim: 1)' (torch clips an oversized ceil_mode window, OpenVINO's AvgPool refuses it)",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_program_before_convert(global_pools_as_means)
