"""HQQ int4 weights with float zero points on XNNPACK's symmetric 4-bit kernel: each group's offset as its own product.

XNNPACK's grouped 4-bit fully-connected (``qd8-f32-qb4w``, what torchao's ``Int8DynamicActivationIntxWeightConfig``
lowers to) takes symmetric weights only: ``w = c * scale``, no zero point. A weight already on a 4-bit grid with
float offsets (a dequantized GGUF Q4_1, like the packaged SmolLM2) is then quantized a second time onto another grid;
SmolLM2's greedy top-1 agreement falls to 75 %. HQQ's solver (torchao's ``_choose_qparams_and_quantize_affine_hqq``)
finds codes, scales and float zero points, ``w = (q - zero) * scale``. With ``m = 8``, the middle code::

    x @ w.T = x @ ((q - m) * scale).T  +  groupsum(x) @ ((m - zero) * scale).T

The first term is the symmetric kernel, its codes ``q - m`` in [-8, 7] and HQQ's scales given to torchao as custom
scales (nothing re-rounded); the second is two small float ``linear`` s XNNPACK also runs: ``x`` times a constant
0/1 matrix that sums each group of inputs, then times the ``[out, in / group]`` offsets. No torchao or ExecuTorch
config writes that, so :func:`split_float_zero_points` does it by hand (as ``onnx_offsets`` does for ONNX Runtime).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

__all__ = ["GroupOffsetLinear", "split_float_zero_points", "takes_float_zero_points"]


class GroupOffsetLinear(torch.nn.Module):
    """``linear(x) + (x @ group_sums.T) @ offsets.T``: a symmetric int4 ``linear`` and its groups' float offsets."""

    def __init__(self, linear: torch.nn.Module, offsets: torch.Tensor, group_size: int):
        super().__init__()
        self.linear = linear
        groups = offsets.shape[1]
        sums = torch.zeros(groups, groups * group_size, dtype=offsets.dtype)
        for g in range(groups):
            sums[g, g * group_size:(g + 1) * group_size] = 1
        self.register_buffer("group_sums", sums)
        self.register_buffer("offsets", offsets.contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        correction = torch.nn.functional.linear(torch.nn.functional.linear(x, self.group_sums), self.offsets)
        return self.linear(x) + correction


def takes_float_zero_points(config: Any) -> bool:
    """Whether ``config`` is torchao's int8-dynamic-activation x int4-weight config with groups (what the split
    serves)."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig
    from torchao.quantization.granularity import PerGroup

    return (isinstance(config, Int8DynamicActivationIntxWeightConfig) and config.weight_dtype == torch.int4
            and isinstance(config.weight_granularity, PerGroup))


def split_float_zero_points(linear: torch.nn.Linear, config: Any) -> GroupOffsetLinear:
    """``linear`` (changed in place) quantized as ``config`` says with HQQ's codes and scales (symmetric codes, custom
    scales), wrapped with its groups' float offsets."""
    from torchao.quantization.quant_primitives import _choose_qparams_and_quantize_affine_hqq
    from torchao.quantization.transform_module import _QUANTIZE_CONFIG_HANDLER

    group = config.weight_granularity.group_size
    weight = linear.weight.detach().float()
    out, size = weight.shape
    codes, scale, zero, _ = _choose_qparams_and_quantize_affine_hqq(
        weight, nbits=4, group_size=group, axis=1, compute_dtype=torch.float32, device="cpu", raw_output=True
    )
    codes = codes.float().reshape(out, size // group, group)
    scale, zero = scale.reshape(out, size // group, 1), zero.reshape(out, size // group, 1)
    middle = 8
    # a new parameter, not the old one's data: a weight tied to another module (an embedding) stays as it was
    symmetric_weight = ((codes - middle) * scale).reshape(out, size).to(linear.weight.dtype)
    linear.weight = torch.nn.Parameter(symmetric_weight, requires_grad=False)
    symmetric = dataclasses.replace(config, intx_choose_qparams_algorithm=None)  # the custom scales as they are
    _QUANTIZE_CONFIG_HANDLER[type(config)](
        linear, symmetric, custom_scale=scale.reshape(out, -1).clone(),
        custom_zero_point=torch.zeros(out, size // group, dtype=torch.int8),
    )
    offsets = ((middle - zero) * scale).reshape(out, size // group).to(torch.float32)
    return GroupOffsetLinear(linear, offsets, group)
