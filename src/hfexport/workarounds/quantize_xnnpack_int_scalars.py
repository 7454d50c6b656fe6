"""PT2E / ExecuTorch: give back their integer dtype to the scalars ``XNNPACKQuantizer`` turns into float tensors.

``XNNPACKQuantizer.transform_for_annotation`` (executorch backends/xnnpack/quantizer/xnnpack_quantizer.py, which
calls torchao's ``_convert_scalars_to_attrs``) turns every scalar argument of ``add``/``mul`` into a
``torch.tensor(float(x))`` constant, integer arithmetic included: the causal mask's index arithmetic then yields
floats, and the prepared graph fails on its first calibration forward ("tensors used as indices must be long").
This wraps the method so that each constant of an integer ``add``/``mul`` takes the node's integer dtype back.
Applied by ``PT2EQuantizer`` around ``prepare_pt2e`` (never during a trace: ``applies`` wants a ``GraphModule``).
Drop it once the upstream pass skips integer ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import patch_attribute, workaround

__all__ = ["integer_scalars_back"]

_MODULE = "executorch.backends.xnnpack.quantizer.xnnpack_quantizer"


def integer_scalars_back(module: Any) -> Any:
    """Cast back (in place) the float scalar constants of the integer ``add``/``mul`` nodes of ``module``."""
    import torch

    for node in module.graph.nodes:
        if node.op != "call_function" or node.target not in (torch.ops.aten.add.Tensor, torch.ops.aten.mul.Tensor):
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor) or value.is_floating_point():
            continue
        for arg in node.args:
            if not isinstance(arg, torch.fx.Node) or arg.op != "get_attr":
                continue
            if str(arg.target).startswith("_tensor_constant"):
                constant = getattr(module, arg.target)
                if constant.is_floating_point():
                    module.register_buffer(arg.target, constant.to(value.dtype))
    return module


def _applies(model: Any, inputs: dict) -> bool:
    import torch

    return isinstance(model, torch.fx.GraphModule)


@workaround(
    id="pt2e-xnnpack-integer-scalars",
    backend="executorch",
    target=f"{_MODULE}.XNNPACKQuantizer.transform_for_annotation",
    breaks="a Llama graph prepared by XNNPACKQuantizer fails on its first calibration forward (the mask's "
    "integer index arithmetic turned float: 'tensors used as indices must be long')",
    upstream=None,
    versions={"executorch": ">=0.6,<1.6"},
    applies=_applies,
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import XNNPACKQuantizer

    original = XNNPACKQuantizer.transform_for_annotation

    def transform_for_annotation(self: Any, model: Any) -> Any:
        return integer_scalars_back(original(self, model))

    return patch_attribute(XNNPACKQuantizer, "transform_for_annotation", transform_for_annotation)
