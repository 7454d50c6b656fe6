"""OpenVINO, ONNX, ExecuTorch: ``F.interpolate(..., antialias=True)`` traced as two matrix products with the resampling
weights.

OpenVINO's PyTorch frontend has no rule for ``aten._upsample_bilinear2d_aa`` or ``aten._upsample_bicubic2d_aa``
("cannot convert aten._upsample_bilinear2d_aa.default", openvino 2026.3.1); torch.onnx writes them as
``Resize(antialias=1)``, which ONNX Runtime (1.32) computes with other weights than ATen's (SigLIP 2's vision model
2.5e-2 from eager); ExecuTorch's ``to_edge`` refuses them (not in the Core ATen opset). They meet them in SigLIP 2's
position embeddings resized to each image's patch grid (SigLIP 2, LFM2-VL, DeepSeek-OCR 2), Cosmos3-Edge's vision
tower and timm's ViTs that resample their position embedding (PE Video, Perception LM). An antialiased resize is
separable and linear: ``out = W_h @ x @ W_w^T``, each row of ``W`` the filter (triangle for bilinear, Keys' cubic
with a = -0.5 for bicubic) centred on the output pixel, stretched by the scale when downsampling, cut to the input's
support and normalised to sum 1, as ATen's ``_compute_weights_aa`` builds them. Here the weights are built with
tensor ops from the output index, so an output size read from a tensor (a grid) stays symbolic. Only 4-D inputs with
``align_corners=False``; anything else keeps ``interpolate``. During an OpenVINO, ONNX or ExecuTorch trace only. Drop
each once its backend converts the ``_aa`` ops as ATen computes them.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import Undo, patch_attribute, workaround

__all__ = ["antialias_weights", "antialias_resize"]

_SUPPORT = {"bilinear": 1.0, "bicubic": 2.0}  # half the filter's width at scale 1


def _filter(mode: str, x: torch.Tensor) -> torch.Tensor:
    x = x.abs()
    if mode == "bilinear":
        return (1 - x).clamp(min=0)
    a = -0.5
    near = ((a + 2) * x - (a + 3)) * x * x + 1
    far = (((x - 5) * x + 8) * x - 4) * a
    return torch.where(x < 1, near, torch.where(x < 2, far, torch.zeros_like(x)))


def antialias_weights(mode: str, in_size: int, out_size: Any, scale: Any = None, device: Any = None) -> torch.Tensor:
    """``[out_size, in_size]`` resampling weights of an antialiased resize by ``scale`` (input / output; ``None``:
    ``in_size / out_size``, computed as a tensor, so that a symbolic output size stays one)."""
    if scale is None:
        scale = (torch.scalar_tensor(in_size, dtype=torch.float32, device=device)
                 / torch.scalar_tensor(out_size, dtype=torch.float32, device=device))
    scale = torch.as_tensor(scale, dtype=torch.float32, device=device)
    support = _SUPPORT[mode] * torch.clamp(scale, min=1.0)
    inverse = 1.0 / torch.clamp(scale, min=1.0)
    center = scale * (torch.arange(out_size, device=device, dtype=torch.float32) + 0.5)[:, None]  # [out, 1]
    source = torch.arange(in_size, device=device, dtype=torch.float32)[None, :]  # [1, in]
    # ATen truncates toward zero; floor is the same here (a negative start is clamped to 0, the end is positive),
    # and OpenVINO converts aten.floor but not aten.trunc
    low = torch.floor(center - support + 0.5).clamp(min=0)
    high = torch.floor(center + support + 0.5).clamp(max=in_size)
    weights = _filter(mode, (source - center + 0.5) * inverse) * ((source >= low) & (source < high))
    return weights / weights.sum(-1, keepdim=True)


def antialias_resize(x: torch.Tensor, size: tuple[Any, Any], scales: tuple[Any, Any], mode: str) -> torch.Tensor:
    """``F.interpolate(x, size, mode=mode, antialias=True, align_corners=False)`` of a ``[N, C, H, W]`` tensor."""
    rows = antialias_weights(mode, x.shape[-2], size[0], scales[0], x.device)
    cols = antialias_weights(mode, x.shape[-1], size[1], scales[1], x.device)
    out = torch.matmul(torch.matmul(rows, x.float()), cols.transpose(0, 1))
    return out.to(x.dtype)


def _pair(value: Any) -> tuple[Any, Any] | None:
    if value is None:
        return None
    return tuple(value) if isinstance(value, (list, tuple)) else (value, value)


def _interpolate(original: Any) -> Any:
    def interpolate(input: Any, size: Any = None, scale_factor: Any = None, mode: str = "nearest",
                    align_corners: bool | None = None, recompute_scale_factor: bool | None = None,
                    antialias: bool = False) -> Any:
        sizes, factors = _pair(size), _pair(scale_factor)
        if (not antialias or mode not in _SUPPORT or align_corners or not isinstance(input, torch.Tensor)
                or input.dim() != 4 or (sizes is None) == (factors is None) or recompute_scale_factor):
            return original(input, size, scale_factor, mode, align_corners, recompute_scale_factor, antialias)
        height, width = input.shape[-2:]
        if sizes is not None:
            sizes = tuple(int(s) if isinstance(s, torch.Tensor) else s for s in sizes)
            scales = (None, None)
        else:  # (ATen resamples by 1 / scale_factor, the output size floored)
            sizes = (int(height * factors[0]), int(width * factors[1]))
            scales = (1.0 / factors[0], 1.0 / factors[1])
        return antialias_resize(input, sizes, scales, mode)

    return interpolate


def _apply(model: Any, inputs: dict) -> Undo:
    return patch_attribute(torch.nn.functional, "interpolate", _interpolate(torch.nn.functional.interpolate))


for _backend, _breaks, _versions in (
    ("openvino", "a program with aten._upsample_bilinear2d_aa / _bicubic2d_aa (SigLIP 2's position embeddings, "
     "Cosmos3-Edge's vision tower) does not convert: 'cannot convert aten._upsample_bilinear2d_aa.default'",
     {"openvino": ">=2024.0,<2027"}),
    ("onnx", "torch.onnx writes Resize(antialias=1), which ONNX Runtime computes with other weights than ATen's: "
     "SigLIP 2's vision model differed from eager by 2.5e-2", {"onnxruntime": ">=1.16,<1.33"}),
    ("executorch", "to_edge refuses aten._upsample_bicubic2d_aa / _bilinear2d_aa, not in the Core ATen opset "
     "(SpecViolationError): timm's ViTs resampling their position embedding to the image (PE Video, Perception LM)",
     {"executorch": ">=0.6,<1.6"}),
):
    workaround(id=f"{_backend}-antialias-resize", backend=_backend, breaks=_breaks, upstream=None, versions=_versions,
               target=f"torch.nn.functional.interpolate(antialias=True) during a {_backend} trace")(_apply)
