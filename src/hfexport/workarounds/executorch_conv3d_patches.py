"""ExecuTorch: a 3-D convolution over inputs the size of its kernel (a video/vision tower's patch embedding) traced as
the matmul it is.

ExecuTorch's portable convolution kernel takes 3-D or 4-D inputs only (``kernel_ops_util.cpp``: "Expect input
tensor to be 3-D or 4-D, but got, 5") and XNNPACK delegates no 3-D convolution, so the ``Conv3d`` patch embedding of
Qwen2.5-VL-like towers (``[patches, C, T, P, P]`` with a ``(T, P, P)`` kernel and stride) lowers and then fails at
run time with error 0x12. Where the input's last three sizes equal the kernel and the stride (no padding, dilation
1, one group), each output is the flattened patch times the flattened kernel: traced as ``linear`` (which XNNPACK
runs), the same numbers. Any other ``Conv3d`` keeps its forward. Seen with executorch 1.5.1; drop it once the
portable kernels or XNNPACK take a 3-D convolution.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import patch_attribute, workaround


def _is_patch_embedding(conv: torch.nn.Conv3d, x: torch.Tensor) -> bool:
    kernel = tuple(conv.kernel_size)
    return (x.dim() == 5 and tuple(x.shape[-3:]) == kernel and tuple(conv.stride) == kernel and conv.groups == 1
            and tuple(conv.dilation) == (1, 1, 1) and conv.padding in ((0, 0, 0), "valid"))


def _applies(model: Any, inputs: dict) -> bool:
    return hasattr(model, "modules") and any(isinstance(m, torch.nn.Conv3d) for m in model.modules())


@workaround(
    id="executorch-conv3d-patches",
    backend="executorch",
    target="torch.nn.Conv3d.forward",
    breaks="ExecuTorch's portable convolution takes 3-D/4-D inputs only and XNNPACK no 3-D convolution: a Conv3d "
    "patch embedding lowers, then fails at run time (aten::convolution.out error 0x12)",
    upstream="executorch kernels/portable/cpu/util/kernel_ops_util.cpp check_convolution_args; no issue known",
    versions={"executorch": ">=1.0,<1.6"},
    applies=_applies,
)
def _apply(model: Any, inputs: dict):
    original = torch.nn.Conv3d.forward

    def forward(self: torch.nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
        if not _is_patch_embedding(self, x):
            return original(self, x)
        out = torch.nn.functional.linear(x.reshape(x.shape[0], -1), self.weight.reshape(self.out_channels, -1),
                                         self.bias)
        return out.reshape(x.shape[0], self.out_channels, 1, 1, 1)

    return patch_attribute(torch.nn.Conv3d, "forward", forward)
