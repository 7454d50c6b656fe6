"""ExecuTorch: a size's ``%`` computed with Python's sign rule, as ``a - (a // b) * b``.

``to_edge`` maps ``operator.mod`` on sizes to ``executorch_prim::mod.Scalar``, whose runtime kernel (executorch
1.5.1) takes C's remainder: ``-6 % 4`` is ``-2`` there and ``2`` in Python, where the program was traced. Padding to
a multiple of a block, ``(-n) % block`` (LongT5's local attention, every "pad to a multiple" in transformers), then
pads by a negative amount ("Padding values must be non-negative, but got pad[3] = -2", error 0x12) or divides by a
block count of zero (the process dies of SIGFPE). ``executorch_prim::floordiv.Scalar`` floors as Python does, so
each size ``a % b`` is rewritten before ``to_edge`` as ``a - (a // b) * b``: the same number for every sign of
``a`` and ``b``. Drop it once ExecuTorch's ``mod.Scalar`` follows Python's rule.

``executorch-size-pow``: ExecuTorch has no prim op for ``operator.pow`` on sizes, and its emitter stops at one
("invalid target for call_function <built-in function pow>": Video-LLaMA 3's tower squares its merge size); each
``a ** k`` of a size and a small constant becomes ``a * a * ...`` before ``to_edge`` and again before ``to_executorch``. Drop it once a prim op exists.
"""

from __future__ import annotations

from typing import Any

from ..capture.graph_passes import sym_mod_as_floordiv, sym_pow_as_products
from .executorch_to_edge import rewrite_edge_programs_before_to_executorch, rewrite_programs_before_to_edge
from .registry import undo_all, workaround

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


@workaround(
    id="executorch-size-pow",
    backend="executorch",
    target="executorch emitter (no executorch_prim op for operator.pow of sizes); EdgeProgramManager.to_executorch",
    breaks="a size raised to a power fails to lower: 'invalid target for call_function <built-in function pow>' "
    "(Video-LLaMA 3's tower)",
    upstream="executorch exir/passes/executorch_prim_ops_registry.py (no pow); no issue known",
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply_pow(model: Any, inputs: dict):
    # before to_edge, and on the edge programs before to_executorch: to_edge's own decomposition writes the sizes
    # again from their expressions (a runtime assert's ``u ** 2``)
    return undo_all([rewrite_programs_before_to_edge(sym_pow_as_products),
                     rewrite_edge_programs_before_to_executorch(sym_pow_as_products)])
