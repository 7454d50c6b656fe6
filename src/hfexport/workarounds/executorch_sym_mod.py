"""ExecuTorch: a size's ``%`` computed with Python's sign rule, as ``a - (a // b) * b``.

``to_edge`` maps ``operator.mod`` on sizes to ``executorch_prim::mod.Scalar``, whose runtime kernel (executorch
1.5.1) takes C's remainder: ``-6 % 4`` is ``-2`` there and ``2`` in Python, where the program was traced. Padding to
a multiple of a block, ``(-n) % block`` (LongT5's local attention, every "pad to a multiple" in transformers), then
pads by a negative amount ("Padding values must be non-negative, but got pad[3] = -2", error 0x12) or divides by a
block count of zero (the process dies of SIGFPE). ``executorch_prim::floordiv.Scalar`` floors as Python does, so
each size ``a % b`` is rewritten before ``to_edge`` as ``a - (a // b) * b``: the same number for every sign of
``a`` and ``b``. Drop it once ExecuTorch's ``mod.Scalar`` follows Python's rule.
"""

from __future__ import annotations

from typing import Any

from ..capture.graph_passes import sym_mod_as_floordiv
from .executorch_to_edge import rewrite_programs_before_to_edge
from .registry import workaround

__all__: list[str] = []


@workaround(
    id="executorch-size-mod-sign",
    backend="executorch",
    target="executorch_prim::mod.Scalar (runtime kernel of operator.mod on sizes)",
    breaks="a size computed as (-n) % block is negative in the ExecuTorch runtime: a negative padding fails "
    "(error 0x12) or a block count of zero kills the process with SIGFPE (LongT5's local attention)",
    upstream="executorch kernels/prim_ops/register_prim_ops.cpp mod.Scalar (C remainder); no issue known",
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_programs_before_to_edge(sym_mod_as_floordiv)
