"""ExecuTorch: an ``empty`` whose size is symbolic keeps its dynamic size (it became the traced size).

``to_edge``'s ``MemoryFormatOpsPass`` (executorch/exir/passes/memory_format_ops_pass.py) rewrites
``aten.empty.memory_format`` into ``dim_order_ops._empty_dim_order``, whose schema takes ``int[] size``
(executorch/exir/passes/dim_order_ops_registry.py), not ``SymInt[]``. Calling it on a symbolic size converts each
``SymInt`` to an int, which guards it to its traced value: the shape environment then replaces the batch and the
prompt (or cache) length by those values for the whole program, so the memory plan holds the traced sizes and the
program refuses any larger input ("method->set_inputs() ... failed with error 0x10"). DeepSeek-V3, GLM-4-MoE-Lite,
Qwen3-Next and the other models whose traced graph holds such an ``empty`` (``[batch, past + 1]``) could take
only the capture's prompt length on ExecuTorch. An ``empty`` has no defined content, so this hands the pass an
``aten.full(size, 0)`` instead where a size is symbolic and the layout contiguous (``full`` takes ``SymInt[]``).
Seen with executorch 1.5.1; no upstream issue known; drop it once ``_empty_dim_order`` takes ``SymInt[] size``.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from .registry import patch_attribute, workaround

__all__ = ["symbolic_size"]

_MODULE = "executorch.exir.passes.memory_format_ops_pass"


def symbolic_size(size: Any) -> bool:
    """Whether a size list (ints, ``SymInt``, or ExecuTorch ``ProxyValue`` s holding them) has a symbolic entry."""
    return isinstance(size, (list, tuple)) and any(isinstance(getattr(s, "data", s), torch.SymInt) for s in size)


@workaround(
    id="executorch-symbolic-empty",
    backend="executorch",
    target=f"{_MODULE}.MemoryFormatOpsPass.call_operator",
    breaks="an aten.empty with a symbolic size becomes dim_order_ops._empty_dim_order(int[] size): the size is "
    "guarded to its traced value, the batch and sequence length are specialised program-wide, and the program "
    "refuses longer prompts or larger caches (set_inputs error 0x10)",
    upstream="executorch/exir/passes/dim_order_ops_registry.py _empty_dim_order schema (int[] size, not SymInt[]); "
    "no issue known",
    versions={"executorch": ">=1.0,<1.6"},
)
def _apply(model: Any, inputs: dict):
    from executorch.exir.dialects._ops import ops as exir_ops

    module = importlib.import_module(_MODULE)
    owner = module.MemoryFormatOpsPass
    original = owner.call_operator
    empty = exir_ops.edge.aten.empty.memory_format
    contiguous = (None, torch.contiguous_format, torch.preserve_format)

    def call_operator(self: Any, op: Any, args: Any, kwargs: Any, meta: Any) -> Any:
        if op == empty and symbolic_size(args[0]) and kwargs.get("memory_format") in contiguous:
            keep = {k: v for k, v in kwargs.items() if k in ("dtype", "layout", "device", "pin_memory")}
            return super(owner, self).call_operator(exir_ops.edge.aten.full.default, (args[0], 0), keep, meta)
        return original(self, op, args, kwargs, meta)

    return patch_attribute(owner, "call_operator", call_operator)
