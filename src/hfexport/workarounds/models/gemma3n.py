"""Gemma-3n: the activation-sparsity cutoff's normal quantile computed before the trace, not traced as ``erfinv``.

``Gemma3nTextMLP._gaussian_topk`` computes ``Normal(0, 1).icdf(torch.tensor(activation_sparsity))`` on every call:
a constant, but traced as ``aten.erfinv`` on a lifted constant, which ONNX has no function for ("No ONNX function
found for <OpOverload(op='prims.erf_inv')>") and ExecuTorch's edge dialect refuses ("aten.erfinv.default is not in
Core ATen opset"). The quantile is computed once per sparsity level with torch itself, outside the trace (the same
float32 value the eager call gives), and the traced ``_gaussian_topk`` uses it as a constant; the rest of the
method is transformers' own arithmetic. Drop it once torchlib and ExecuTorch handle ``erfinv`` (or transformers
computes the quantile at init).
"""

from __future__ import annotations

import sys
from typing import Any

from ..registry import Workaround, patch_attribute, register_workaround

_MODULE = "transformers.models.gemma3n.modeling_gemma3n"


def _mlps(model: Any) -> list[Any]:
    module = sys.modules.get(_MODULE)
    kind = getattr(module, "Gemma3nTextMLP", None) if module is not None else None
    if kind is None or not hasattr(model, "modules"):
        return []
    return [m for m in model.modules() if type(m) is kind and getattr(m, "activation_sparsity", 0.0) > 0.0]


def _apply(model: Any, inputs: dict):
    import torch

    kind = type(_mlps(model)[0])
    quantiles = {}
    for mlp in _mlps(model):  # eager, real tensors: the value the model's own call computes
        p = float(mlp.activation_sparsity)
        quantiles[p] = float(torch.distributions.normal.Normal(0, 1).icdf(torch.tensor(p, dtype=torch.float32)))
    original = kind._gaussian_topk

    def _gaussian_topk(self: Any, inputs: torch.Tensor) -> torch.Tensor:
        multiplier = quantiles.get(float(self.activation_sparsity))
        if multiplier is None:
            return original(self, inputs)
        inputs_mean = torch.mean(inputs, dim=-1, keepdim=True)
        inputs_std = torch.std(inputs, dim=-1, keepdim=True, unbiased=False)
        cutoff_x = inputs_mean + inputs_std * torch.tensor(multiplier, dtype=inputs.dtype, device=inputs.device)
        return torch.nn.functional.relu(inputs - cutoff_x)

    return patch_attribute(kind, "_gaussian_topk", _gaussian_topk)


for _backend, _versions, _breaks, _upstream in (
    ("onnx", {"onnxscript": "<=0.7.0"}, "Gemma-3n's activation sparsity does not convert: 'No ONNX function found for "
     "<OpOverload(op='prims.erf_inv', overload='default')>'", "onnxscript torch_lib (no erf_inv); no issue known"),
    ("executorch", {"executorch": ">=1.0,<1.6"}, "to_edge refuses Gemma-3n's activation sparsity: "
     "'aten.erfinv.default is not in Core ATen opset'", "executorch/exir/verification (erfinv not Core ATen); no "
     "issue known"),
):
    register_workaround(Workaround(
        id=f"{_backend}-gemma3n-constant-quantile",
        backend=_backend,
        target=f"{_MODULE}.Gemma3nTextMLP._gaussian_topk (Normal(0, 1).icdf of a constant, traced as erfinv)",
        breaks=_breaks,
        upstream=_upstream,
        versions=_versions,
        apply=_apply,
        applies=lambda model, inputs: bool(_mlps(model)),
    ))
