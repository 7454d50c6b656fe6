"""ExecuTorch: a constant pad with negative amounts (a crop) traced as a slice, then a pad of the positive amounts.

``F.pad`` takes negative amounts and crops there (RWKV's time shift, ``nn.ZeroPad2d((0, 0, 1, -1))``: one step
later, the last one dropped), but ExecuTorch's portable ``constant_pad_nd`` refuses them at run time ("Padding
values must be non-negative, but got pad[3] = -1", error 0x12, executorch 1.5.1), so RWKV's decode steps failed.
While tracing for ExecuTorch such a call narrows each axis by its negative amounts first and pads the positive
ones: the same tensor. Other calls go to torch's own. Drop it once the kernel crops.
"""

from __future__ import annotations

from typing import Any

from .registry import Undo, patch_attribute, workaround

__all__ = ["crop_then_pad"]


def crop_then_pad(original: Any) -> Any:
    """``F.pad`` that turns a constant pad's negative amounts into a ``narrow`` first; other calls to ``original``."""

    def pad(input: Any, pad: Any, mode: str = "constant", value: Any = None) -> Any:
        if mode != "constant" or not any(isinstance(p, int) and p < 0 for p in pad):
            return original(input, pad, mode, value)
        cropped = input
        for i in range(len(pad) // 2):
            dim, before, after = input.dim() - 1 - i, pad[2 * i], pad[2 * i + 1]
            start, stop = max(-before, 0), max(-after, 0)
            if start or stop:
                cropped = cropped.narrow(dim, start, cropped.shape[dim] - start - stop)
        return original(cropped, [max(p, 0) for p in pad], mode, value)

    return pad


@workaround(
    id="executorch-negative-pad",
    backend="executorch",
    target="torch.nn.functional.pad during an ExecuTorch trace (portable constant_pad_nd: no negative amounts)",
    breaks="a crop written as a negative pad fails at run time: 'Padding values must be non-negative', error 0x12 "
    "(RWKV's time shift)",
    upstream="executorch kernels/portable/cpu/util/kernel_ops_util.cpp check_constant_pad_args; no issue known",
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply(model: Any, inputs: dict) -> Undo:
    import torch.nn.functional as F

    return patch_attribute(F, "pad", crop_then_pad(F.pad))
