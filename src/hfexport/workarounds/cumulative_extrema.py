"""ONNX, OpenVINO, ExecuTorch: ``torch.cummax`` and ``torch.cummin`` traced as a masked maximum (minimum) over each
position's prefix.

``aten.cummax`` and ``aten.cummin`` convert on none of them: torch.onnx has no torchlib function for them ("No ONNX
function found", onnxscript 0.7.0), OpenVINO's PyTorch frontend no rule ("cannot convert aten.cummax", openvino
2026.3.1), and ExecuTorch's ``to_edge`` refuses them ("aten.cummax.default is not in Core ATen"). Grounding DINO and
MM Grounding DINO find each text token's previous and next special tokens with them, Qwen3-Omni its previous
``<|im_start|>``, ESMFold 2 its group starts. While tracing for those backends, ``cummax(x, dim)`` is computed as
``amax`` over a ``[..., n, n]`` lower-triangular mask of each position's prefix (n = the size of ``dim``), and its
indices as the last prefix position holding that maximum, which is the index ``torch.cummax`` returns on ties (the
same with ``amin`` for cummin). Quadratic in n: meant for the token-length scans these models make. Drop each once
its backend converts them.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import Undo, patch_attribute, undo_all, workaround

__all__ = ["cumulative_by_prefix_mask"]


def cumulative_by_prefix_mask(x: torch.Tensor, dim: int, largest: bool = True) -> Any:
    """``torch.cummax(x, dim)`` (``largest``) or ``torch.cummin(x, dim)``, values and indices as
    ``torch.return_types.cummax`` / ``cummin``, without ``aten.cummax`` / ``aten.cummin``."""
    kind = torch.return_types.cummax if largest else torch.return_types.cummin
    if x.dim() == 0:
        return kind((x.clone(), torch.zeros_like(x, dtype=torch.long)))
    moved = x.movedim(dim, -1)
    n = moved.shape[-1]
    positions = torch.arange(n, device=x.device)
    prefix = positions[None, :] <= positions[:, None]  # [i, j]: j is in position i's prefix
    rows = moved.unsqueeze(-2).expand(*moved.shape[:-1], n, n)  # [..., i, j] = x[..., j]
    info = torch.finfo(x.dtype) if x.is_floating_point() else torch.iinfo(x.dtype)
    outside = torch.full((), info.min if largest else info.max, dtype=x.dtype, device=x.device)
    masked = torch.where(prefix, rows, outside)
    values = masked.amax(-1) if largest else masked.amin(-1)
    hits = prefix & (rows == values.unsqueeze(-1))
    indices = torch.where(hits, positions, torch.full((), -1, dtype=torch.long, device=x.device)).amax(-1)
    return kind((values.movedim(-1, dim), indices.movedim(-1, dim)))


def _cumulative(original: Any, largest: bool) -> Any:
    def cumulative(input: Any, dim: int, *args: Any, **kwargs: Any) -> Any:
        if args or kwargs or not isinstance(input, torch.Tensor) or input.dtype == torch.bool:
            return original(input, dim, *args, **kwargs)
        return cumulative_by_prefix_mask(input, dim, largest)

    return cumulative


def _apply(model: Any, inputs: dict) -> Undo:
    return undo_all([patch_attribute(owner, f"cum{kind}", _cumulative(getattr(owner, f"cum{kind}"), kind == "max"))
                     for owner in (torch, torch.Tensor) for kind in ("max", "min")])


for _backend, _breaks, _versions in (
    ("onnx", "torch.onnx has no function for aten.cummax / aten.cummin: 'No ONNX function found'",
     {"onnxscript": ">=0.1,<0.8"}),
    ("openvino", "the PyTorch frontend has no rule for aten.cummax / aten.cummin: 'cannot convert aten.cummax'",
     {"openvino": ">=2024.0,<2027"}),
    ("executorch", "to_edge refuses aten.cummax / aten.cummin: 'aten.cummax.default is not in Core ATen'",
     {"executorch": ">=1.0,<1.6"}),
):
    workaround(id=f"{_backend}-cummax-cummin", backend=_backend, target=f"torch.cummax / cummin, torch.Tensor.cummax / cummin during a "
               f"{_backend} trace", breaks=_breaks, upstream=None, versions=_versions)(_apply)
