"""OpenVINO: an ``aten.index_put`` by a boolean mask with one value for every selected row becomes a ``where``.

``x[ids == token] = embedding`` (T5Gemma 2's end-of-image embedding written over its placeholder tokens) traces as
``aten.index_put(x, [mask], embedding)``, and the PyTorch frontend has no conversion for it as ``torch.export`` emits
it ("cannot convert SequenceMark, aten.index_put.default": the list of indices). Where the value broadcasts over the
rows the mask selects (its rank at most ``x``'s past the mask's), the assignment is ``where(mask, value, x)``, which
this wraps ``openvino.convert_model`` to write instead. ``x[:, :, ids] = value`` (Chameleon's logits of its image
tokens set to the dtype's minimum) is ``index_put(x, [None, None, ids], value)``, and the frontend's replacer fails on
the one-element value ("Input order must have shape [n]"); a one-element value written at integer positions along one
axis is ``where(positions_mask, value, x)`` too, the mask ``arange(size) == ids`` along that axis. Other
``index_put`` calls are left as they are. Seen with openvino 2026.3.1; no upstream issue known; drop it once the
frontend converts these ``index_put`` forms.
"""

from __future__ import annotations

from typing import Any

from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["mask_fill_as_where", "decompose_mask_fills"]


def mask_fill_as_where(self: Any, indices: Any, values: Any, accumulate: bool = False) -> Any:
    """``self.index_put(indices, values)`` for one boolean mask and a value that broadcasts over the selected rows,
    or for one integer index along one axis (the others ``None``: ``x[:, :, ids] = v``) and a one-element value."""
    import torch

    if len(indices) == 1 and indices[0].dtype == torch.bool:
        mask = indices[0]
        mask = mask.reshape(*mask.shape, *([1] * (self.dim() - mask.dim())))
    else:
        axis = next(i for i, index in enumerate(indices) if index is not None)
        size = self.shape[axis]
        ids = torch.remainder(indices[axis].reshape(-1), size)  # (a negative index counts from the end)
        mask = (torch.arange(size, device=self.device)[:, None] == ids[None, :]).any(1)
        mask = mask.reshape(*([1] * axis), size, *([1] * (self.dim() - axis - 1)))
    return torch.where(mask, values.to(self.dtype), self)


def _index_puts() -> tuple[Any, ...]:
    import torch

    return torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default


def _is_mask_fill(node: Any) -> bool:
    """Whether ``node`` (an ``index_put``) is one :func:`mask_fill_as_where` writes exactly."""
    import torch

    from ..capture.graph_passes import traced

    args = list(node.args) + [node.kwargs.get("accumulate", False)] * (4 - len(node.args))
    target, indices, values, accumulate = (traced(args[0]), args[1], traced(args[2]), args[3])
    if accumulate or not isinstance(indices, (list, tuple)) or len(indices) != 1:
        return False
    mask = traced(indices[0])
    return (isinstance(target, torch.Tensor) and isinstance(values, torch.Tensor) and isinstance(mask, torch.Tensor)
            and mask.dtype == torch.bool and values.dim() <= target.dim() - mask.dim())


def _is_axis_fill(node: Any) -> bool:
    """Whether ``node`` (an ``index_put``) writes one value at integer positions along one axis (Chameleon's
    ``logits[:, :, image_tokens] = min``), which :func:`mask_fill_as_where` writes exactly."""
    import torch

    from ..capture.graph_passes import traced

    args = list(node.args) + [node.kwargs.get("accumulate", False)] * (4 - len(node.args))
    target, indices, values, accumulate = (traced(args[0]), args[1], traced(args[2]), args[3])
    if accumulate or not isinstance(indices, (list, tuple)) or not isinstance(target, torch.Tensor):
        return False
    given = [traced(index) for index in indices if index is not None]
    return (len(given) == 1 and isinstance(given[0], torch.Tensor) and given[0].dim() == 1
            and not given[0].is_floating_point() and given[0].dtype != torch.bool
            and isinstance(values, torch.Tensor) and values.dim() == 0)


def decompose_mask_fills(program: Any) -> Any:
    """``program`` with its boolean-mask fills written as ``where`` (a new ``ExportedProgram``), or ``program`` itself
    when it has none or also another kind of ``index_put`` (which the same decomposition would then miswrite)."""
    import torch

    from ..capture.graph_passes import calls_to

    puts = calls_to(program, _index_puts())
    if not puts or not all(_is_mask_fill(node) or _is_axis_fill(node) for node in puts):
        return program
    # (the in-place index_put_ is functionalized into index_put first)
    return program.run_decompositions({torch.ops.aten.index_put.default: mask_fill_as_where})


@workaround(
    id="openvino-mask-fill",
    backend="openvino",
    target="openvino.convert_model (aten.index_put of an ExportedProgram)",
    breaks="x[mask] = value and x[:, :, ids] = value trace as aten.index_put with a list of indices, which the "
    "PyTorch frontend cannot convert ('cannot convert SequenceMark, aten.index_put.default'): T5Gemma 2's encoder, "
    "Chameleon's image-token logits",
    upstream=None,
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_program_before_convert(decompose_mask_fills)
