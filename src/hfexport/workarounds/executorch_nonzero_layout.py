"""ExecuTorch: ``nonzero``'s result traced row-major, as ExecuTorch's kernel writes it.

torch's ``nonzero`` returns its ``[count, ndim]`` indices column-major, strides ``(1, count)`` (its CPU kernel and
its fake one, ``torch._subclasses.fake_impls.nonzero``, alike), so ``to_executorch`` gives the tensor the dim order
``[1, 0]``, while ExecuTorch's portable kernel writes it row-major. The next ``slice_copy`` (``idx[:, 1]``) then
refuses its input ("2 input tensors have different dim orders", error 0x12, executorch 1.5.1: Music Flamingo's audio
features, which keep their real frames with a boolean mask), and a copy to the contiguous order reads the indices
transposed (measured here: ``[10, 10, 10, 22]`` for ``[0, 20, 11, 21]``). Setting the traced value's strides on the
edge program does not hold: ``to_executorch`` propagates the fake values again. So while an ExecuTorch export runs,
the fake kernel gives the same tensor with row-major strides, what the portable kernel writes (the values are the
same either way). Drop it once ExecuTorch gives ``nonzero``'s output the order its kernel writes.
"""

from __future__ import annotations

from typing import Any

from .registry import Undo, workaround

__all__ = ["row_major_nonzero"]


def row_major_nonzero(original: Any) -> Any:
    """The fake ``nonzero`` implementation ``original`` with its result's strides made row-major."""

    def nonzero(fake_mode: Any, func: Any, arg: Any) -> Any:
        out = original(fake_mode, func, arg)
        if out.dim() != 2:
            return out
        return out.new_empty_strided(out.shape, (out.shape[1], 1), dtype=out.dtype)

    return nonzero


@workaround(
    id="executorch-nonzero-layout",
    backend="executorch",
    target="torch._subclasses.fake_impls.nonzero (column-major strides) -> ExecuTorch dim order",
    breaks="a slice of nonzero's indices fails at run time: '2 input tensors have different dim orders' in "
    "slice_copy, error 0x12 (Music Flamingo's audio features)",
    upstream="torch/_subclasses/fake_impls.py nonzero (strides (1, count)); no issue known",
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply(model: Any, inputs: dict) -> Undo:
    import torch
    from torch._subclasses import fake_impls

    table, op = fake_impls.op_implementations_dict, torch.ops.aten.nonzero.default
    original = table[op]
    table[op] = row_major_nonzero(original)

    def undo() -> None:
        table[op] = original

    return undo
