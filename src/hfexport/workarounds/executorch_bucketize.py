"""ExecuTorch: ``torch.bucketize`` traced as a count of the boundaries below each value.

``aten.bucketize.Tensor`` is not in the Core ATen opset, has no decomposition, and ExecuTorch's portable kernels
register none, so ``to_edge`` refuses the program ("Operator torch._ops.aten.bucketize.Tensor is not in Core ATen
opset": the patch position ids of Idefics2/3's and SmolVLM's vision embeddings, ``torch.bucketize(fractional_coords,
boundaries, right=True)``). For sorted 1-D ``boundaries`` the bucket index is how many boundaries lie below the value
(``<`` with ``right=False``, ``<=`` with ``right=True``), which is what ``bucketize`` returns: during an ExecuTorch
trace it is computed that way (a comparison against every boundary and a sum, exact). Other calls keep ``bucketize``.
Drop it once ExecuTorch decomposes or registers ``bucketize``.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import Undo, patch_attribute, workaround

__all__ = ["bucketize_by_counting"]


def bucketize_by_counting(values: torch.Tensor, boundaries: torch.Tensor, *, out_int32: bool = False,
                          right: bool = False) -> torch.Tensor:
    """``torch.bucketize(values, boundaries, out_int32=out_int32, right=right)`` for sorted 1-D ``boundaries``."""
    below = boundaries <= values.unsqueeze(-1) if right else boundaries < values.unsqueeze(-1)
    return below.sum(-1, dtype=torch.int32 if out_int32 else torch.int64)


def _bucketize(original: Any) -> Any:
    def bucketize(values: Any, boundaries: Any, *, out_int32: bool = False, right: bool = False, **kwargs: Any) -> Any:
        if (kwargs or not isinstance(values, torch.Tensor) or not isinstance(boundaries, torch.Tensor)
                or boundaries.dim() != 1):
            return original(values, boundaries, out_int32=out_int32, right=right, **kwargs)
        return bucketize_by_counting(values, boundaries, out_int32=out_int32, right=right)

    return bucketize


@workaround(
    id="executorch-bucketize",
    backend="executorch",
    target="torch.bucketize during an ExecuTorch trace",
    breaks="a program with aten.bucketize (Idefics2/3 and SmolVLM vision embeddings) is refused by to_edge: not in "
    "the Core ATen opset, no kernel",
    upstream="executorch/kernels/portable/functions.yaml (no bucketize); no issue known",
    versions={"executorch": ">=1.0,<1.6"},
)
def _apply(model: Any, inputs: dict) -> Undo:
    return patch_attribute(torch, "bucketize", _bucketize(torch.bucketize))
