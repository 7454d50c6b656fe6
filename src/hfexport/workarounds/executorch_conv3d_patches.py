"""ExecuTorch: a 3-D convolution over inputs the size of its kernel (a video/vision tower's patch embedding) traced as
the matmul it is.

ExecuTorch's portable convolution kernel takes 3-D or 4-D inputs only (``kernel_ops_util.cpp``: "Expect input
tensor to be 3-D or 4-D, but got, 5") and XNNPACK delegates no 3-D convolution, so the ``Conv3d`` patch embedding of
Qwen2.5-VL-like towers (``[patches, C, T, P, P]`` with a ``(T, P, P)`` kernel and stride) and the tubelet embedding
of video towers (ViViT, VideoMAE: a whole clip, stride = kernel) lower and then fail at run time with error 0x12.
Where the stride equals the kernel (no padding, dilation 1, one group), each output is a window of the input,
flattened, times the flattened kernel: traced as ``linear`` (which XNNPACK runs) over the windows, the same numbers. Any other ``Conv3d`` keeps its forward. Seen with executorch 1.5.1; drop it once the
portable kernels or XNNPACK take a 3-D convolution.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import patch_attribute, workaround


def _is_patch_embedding(conv: torch.nn.Conv3d, x: torch.Tensor) -> bool:
    """A convolution whose windows tile its input without overlap: stride = kernel, no padding, dilation 1, one group
    (a kernel-sized patch, or a whole clip cut into tubelets: ViViT, VideoMAE)."""
    kernel = tuple(conv.kernel_size)
    return (x.dim() == 5 and all(s >= k for s, k in zip(x.shape[-3:], kernel)) and tuple(conv.stride) == kernel
            and conv.groups == 1 and tuple(conv.dilation) == (1, 1, 1) and conv.padding in ((0, 0, 0), "valid"))


def _tubelets(conv: torch.nn.Conv3d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` as a ``linear`` over the flattened windows: ``x`` cut into ``[B, T', H', W', C * kt * kh * kw]``
    (the remainder a strided convolution drops, dropped), times the flattened kernel, moved back to channels first."""
    kt, kh, kw = conv.kernel_size
    b, c = x.shape[:2]
    t, h, w = (size // k for size, k in zip(x.shape[-3:], (kt, kh, kw)))
    # (in steps of at most 6 dims: XNNPACK defines no tensor of more, xnn_status_unsupported_parameter)
    x = x[:, :, : t * kt, : h * kh, : w * kw].reshape(b * c * t, kt, h, kh, w, kw).permute(0, 2, 4, 1, 3, 5)
    x = x.reshape(b, c, t, h, w, kt * kh * kw).permute(0, 2, 3, 4, 1, 5)
    windows = x.reshape(b, t, h, w, c * kt * kh * kw)
    out = torch.nn.functional.linear(windows, conv.weight.reshape(conv.out_channels, -1), conv.bias)
    return out.permute(0, 4, 1, 2, 3)


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
        return _tubelets(self, x) if _is_patch_embedding(self, x) else original(self, x)

    return patch_attribute(torch.nn.Conv3d, "forward", forward)
