"""OpenVINO, ExecuTorch: ``Tensor.scatter_reduce`` traced as a masked reduction over each output position's sources.

``aten.scatter_reduce.two`` converts on neither: OpenVINO's PyTorch frontend has no rule for it ("cannot convert
aten.scatter_reduce.two", openvino 2026.3.1), and ExecuTorch lowers it but its runtime has no kernel
(``kernel 'aten::scatter_reduce.two_out' not found``, "Failed to load method forward, error: 0x14", executorch
1.5.1). TAPAS averages (and takes maxima of) its token values per table cell and column with it. While tracing for
those backends, ``self.scatter_reduce(dim, index, src, reduce, include_self)`` is computed, where ``index`` has
``src``'s shape and both have ``self``'s outside ``dim`` (a segment reduction), over a ``[..., S, N]`` mask of which
of the ``N`` sources each of the ``S`` positions receives, with ``sum`` / ``prod`` / ``amax`` / ``amin`` over the
sources; ``mean`` divides the sum by the count, as torch does (an integer mean with floor division). Quadratic in
the sizes along ``dim``: meant for the segment sizes these models reduce. Other layouts keep the op. Drop each once
its backend converts it.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import Undo, patch_attribute, undo_all, workaround

__all__ = ["scatter_reduce_by_mask"]

_REDUCES = ("sum", "prod", "mean", "amax", "amin")


def _fits(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor) -> bool:
    """A segment reduction: ``index`` of ``src``'s shape, both of ``self``'s shape outside ``dim``."""
    if not all(isinstance(t, torch.Tensor) for t in (self, index, src)) or self.dim() != src.dim():
        return False
    if index.shape != src.shape:
        return False
    dim = dim % max(self.dim(), 1)
    return all(a == b for i, (a, b) in enumerate(zip(self.shape, src.shape)) if i != dim)


def scatter_reduce_by_mask(self: torch.Tensor, dim: int, index: torch.Tensor, src: torch.Tensor, reduce: str,
                           include_self: bool = True) -> torch.Tensor:
    """``self.scatter_reduce(dim, index, src, reduce, include_self=include_self)`` for a segment reduction (see the
    module's docstring), without ``aten.scatter_reduce``."""
    dim = dim % max(self.dim(), 1)
    base, values, where = self.movedim(dim, -1), src.movedim(dim, -1).to(self.dtype), index.movedim(dim, -1)
    positions = torch.arange(base.shape[-1], device=self.device)
    hits = where.unsqueeze(-2) == positions[:, None]  # [..., S, N]: source j goes to position i
    rows = values.unsqueeze(-2)  # [..., 1, N]
    floating = self.is_floating_point()
    info = torch.finfo(self.dtype) if floating else torch.iinfo(self.dtype)
    neutral = {"sum": 0, "mean": 0, "prod": 1, "amax": info.min, "amin": info.max}[reduce]
    masked = torch.where(hits, rows, torch.full((), neutral, dtype=self.dtype, device=self.device))
    count = hits.sum(-1)
    if reduce in ("sum", "mean"):
        out = masked.sum(-1, dtype=self.dtype)
    elif reduce == "prod":
        out = masked.prod(-1, dtype=self.dtype)
    else:
        out = masked.amax(-1) if reduce == "amax" else masked.amin(-1)
    if include_self:
        if reduce in ("sum", "mean"):
            out = out + base
        elif reduce == "prod":
            out = out * base
        else:
            out = torch.maximum(out, base) if reduce == "amax" else torch.minimum(out, base)
        count = count + 1
    if reduce == "mean":
        divisor = count.clamp(min=1).to(self.dtype)
        out = out / divisor if floating else torch.div(out, divisor, rounding_mode="floor")
    if not include_self:
        out = torch.where(count > 0, out, base)
    return out.movedim(-1, dim)


def _scatter_reduce(original: Any) -> Any:
    def scatter_reduce(self: Any, dim: int, index: Any, src: Any, reduce: str, *, include_self: bool = True) -> Any:
        if reduce not in _REDUCES or not _fits(self, dim, index, src) or self.dtype == torch.bool:
            return original(self, dim, index, src, reduce, include_self=include_self)
        return scatter_reduce_by_mask(self, dim, index, src, reduce, include_self)

    return scatter_reduce


def _apply(model: Any, inputs: dict) -> Undo:
    return undo_all([patch_attribute(owner, "scatter_reduce", _scatter_reduce(owner.scatter_reduce))
                     for owner in (torch, torch.Tensor)])


for _backend, _breaks, _versions in (
    ("openvino", "the PyTorch frontend has no rule for aten.scatter_reduce.two: 'cannot convert "
     "aten.scatter_reduce.two' (TAPAS)", {"openvino": ">=2024.0,<2027"}),
    ("executorch", "the runtime has no kernel for aten.scatter_reduce.two: \"kernel 'aten::scatter_reduce.two_out' "
     "not found\", load error 0x14 (TAPAS)", {"executorch": ">=1.0,<1.6"}),
):
    workaround(id=f"{_backend}-scatter-reduce", backend=_backend,
               target=f"torch.scatter_reduce / torch.Tensor.scatter_reduce during a {_backend} trace", breaks=_breaks,
               upstream=None, versions=_versions)(_apply)
