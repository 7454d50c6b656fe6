"""OpenVINO: ``Tensor.unfold`` over a static dimension traced as a gather of its windows.

The PyTorch frontend has no rule for ``aten.unfold`` as ``torch.export`` emits it ("cannot convert
aten.unfold.default": PatchTST's and PatchTSMixer's patching, ``past_values.unfold(-2, patch_length,
patch_stride)``). Where the unfolded dimension's size is a static int, the windows are
``index_select(dim, starts[:, None] + arange(size))`` moved to where ``unfold`` puts them (a new last dim of ``size``
after the ``count`` windows in ``dim``): the same values, in the same layout. A symbolic size keeps ``unfold``. During
an OpenVINO trace only. Drop it once the frontend converts ``aten.unfold``.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import Undo, patch_attribute, workaround

__all__ = ["unfold_by_gather"]


def unfold_by_gather(x: torch.Tensor, dimension: int, size: int, step: int) -> torch.Tensor:
    """``x.unfold(dimension, size, step)`` for a static ``x.shape[dimension]``, with ``index_select``."""
    dim = dimension % x.dim()
    count = (x.shape[dim] - size) // step + 1
    index = (torch.arange(count) * step)[:, None] + torch.arange(size)  # [count, size]
    windows = x.index_select(dim, index.reshape(-1).to(x.device))  # dim now holds count * size values
    windows = windows.reshape(*x.shape[:dim], count, size, *x.shape[dim + 1:])
    return windows.movedim(dim + 1, -1)


def _unfold(original: Any) -> Any:
    def unfold(self: Any, dimension: int, size: int, step: int) -> Any:
        if (not isinstance(self, torch.Tensor) or self.dim() == 0 or not isinstance(size, int)
                or not isinstance(step, int) or not isinstance(self.shape[dimension], int)):
            return original(self, dimension, size, step)
        return unfold_by_gather(self, dimension, size, step)

    return unfold


@workaround(
    id="openvino-unfold",
    backend="openvino",
    target="torch.Tensor.unfold during an OpenVINO trace",
    breaks="a program with aten.unfold (PatchTST, PatchTSMixer patching) does not convert: 'cannot convert "
    "aten.unfold.default'",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict) -> Undo:
    return patch_attribute(torch.Tensor, "unfold", _unfold(torch.Tensor.unfold))
