"""ExecuTorch: ``repeat_interleave`` with a tensor of repeats, decomposed into a cumulative sum and a comparison.

``torch.repeat_interleave(x, repeats)`` with a tensor ``repeats`` (the rows of each image's patch grid, a vision
tower's sequence ids) traces as ``aten.repeat_interleave.Tensor``, which ``to_edge``'s verifier refuses ("Operator
torch._ops.aten.repeat_interleave.Tensor is not in Core ATen opset", executorch 1.5.1: HunYuan-VL, Muse Spark), and
torch has no decomposition of it. Before ``to_edge`` the program is decomposed with this one: the output's ``i``-th
entry is the number of cumulative repeats at or below ``i`` (``sum(arange(total)[:, None] >= cumsum(repeats))``),
the same indices, in ``total x len(repeats)`` comparisons. Drop it once the op is core ATen or decomposed upstream.
"""

from __future__ import annotations

from typing import Any

import torch

from .executorch_to_edge import rewrite_programs_before_to_edge
from .registry import workaround

__all__ = ["indices_of_repeats", "repeat_rows", "decompose_repeat_interleave"]

_OP = torch.ops.aten.repeat_interleave.Tensor
# (the self forms are composite: ``to_edge`` decomposes them into index_select over the op above)
_FORMS = (_OP, torch.ops.aten.repeat_interleave.self_Tensor)


def indices_of_repeats(repeats: torch.Tensor, output_size: int | None = None) -> torch.Tensor:
    """``aten.repeat_interleave.Tensor``: index ``j`` repeated ``repeats[j]`` times, with elementwise ops."""
    ends = torch.cumsum(repeats, 0)
    total = output_size if output_size is not None else ends[-1].item()
    torch._check(total >= 0)
    positions = torch.arange(total, device=repeats.device, dtype=ends.dtype)
    return (positions.unsqueeze(-1) >= ends.unsqueeze(0)).sum(-1).to(repeats.dtype)


def repeat_rows(x: torch.Tensor, repeats: torch.Tensor, dim: int | None = None,
                output_size: int | None = None) -> torch.Tensor:
    """``aten.repeat_interleave.self_Tensor``: ``x``'s entries along ``dim`` (flattened when ``None``) each repeated
    ``repeats`` times, an ``index_select`` by :func:`indices_of_repeats`."""
    if dim is None:
        x, dim = x.flatten(), 0
    if repeats.numel() == 1:  # one count for every entry
        repeats = repeats.reshape(1).expand(x.shape[dim])
    return torch.index_select(x, dim, indices_of_repeats(repeats, output_size))


def decompose_repeat_interleave(program: Any) -> Any:
    """``program`` decomposed with :func:`indices_of_repeats` (a new ``ExportedProgram``), or ``program`` itself when
    it has no ``repeat_interleave.Tensor``."""
    from ..capture.graph_passes import calls_to

    if not calls_to(program, _FORMS):
        return program
    return program.run_decompositions({_OP: indices_of_repeats, _FORMS[1]: repeat_rows})


@workaround(
    id="executorch-repeat-interleave-tensor",
    backend="executorch",
    target="executorch.exir.to_edge (aten.repeat_interleave.Tensor is not core ATen; torch has no decomposition)",
    breaks="a repeat_interleave with a tensor of repeats fails to_edge's verifier: 'Operator "
    "torch._ops.aten.repeat_interleave.Tensor is not in Core ATen opset' (HunYuan-VL, Muse Spark)",
    upstream=None,
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_programs_before_to_edge(decompose_repeat_interleave)
