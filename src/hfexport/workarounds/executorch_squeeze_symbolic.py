"""ExecuTorch: ``squeeze(dim)`` of a dimension traced at a symbolic size stays the no-op the trace made of it.

torch removes a squeezed dimension only where it knows the size is 1: one traced at a symbolic size is kept, and
the program goes on at that rank. ExecuTorch's ``squeeze_copy.dims_out`` kernel (kernels/portable/cpu/
op_squeeze_copy.cpp, executorch 1.5.1) decides again from the sizes at run time: where such a dimension is 1 then
(Kimi-K2.5's vision tower, on an image whose grid has one row of merged patches), it drops it, and its output,
planned at the traced rank, cannot take the new one ("Check failed (resize_tensor(out, {expected_out_size,
expected_out_dim}) == Error::Ok)", error 0x12). Before ``to_edge`` each ``aten.squeeze.dim(s)`` keeps only the
dims traced at a static 1 (an ``alias`` where none is left), as the trace did. Drop it once the kernel keeps the
rank it was planned at.
"""

from __future__ import annotations

from typing import Any

from .executorch_to_edge import rewrite_programs_before_to_edge
from .registry import workaround

__all__ = ["squeeze_static_ones"]


def squeeze_static_ones(program: Any) -> int:
    """Keep in every ``aten.squeeze.dim(s)`` of ``program`` only the dims traced at a static 1; returns how many
    nodes changed."""
    from ..capture.graph_passes import narrow_squeezes

    return narrow_squeezes(program, lambda size: isinstance(size, int) and size == 1)


@workaround(
    id="executorch-squeeze-symbolic",
    backend="executorch",
    target="executorch kernels/portable/cpu/op_squeeze_copy.cpp (squeeze_copy.dims_out)",
    breaks="a squeeze of a dim traced at a symbolic size that is 1 at run time fails: 'Check failed "
    "(resize_tensor(out, {expected_out_size, expected_out_dim}) == Error::Ok)', error 0x12 (Kimi-K2.5's tower)",
    upstream=None,
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_programs_before_to_edge(squeeze_static_ones)
