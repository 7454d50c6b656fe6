"""torch.export with real-tensor propagation: integer floor division of a tensor with symbolic sizes no longer stops
the trace.

Where a model branches on tensor values, the trace is taken again with the sample's real values propagated
(:mod:`hfexport.capture.trace`, as ``torch.export.draft_export`` does). A fake tensor with symbolic sizes runs
``aten.floor_divide`` through its Python reference (``torch._refs.floor_divide``), which for integers asks
``prims.signbit``; that prim is declared with the default type promotion (torch/_prims/__init__.py, ``signbit =
_make_elementwise_unary_prim(..., type_promotion=DEFAULT)``), so its meta returns the input's integer dtype where
``torch.signbit`` returns bool. Only real-tensor propagation compares the two, and the trace fails on the mismatch
("metadata mismatch between fake tensor ... dtype=torch.int32 and real tensor tensor([[False, ...", or, where torch
makes a kernel from the real output instead, "Pending unbacked symbols {u16, u17} not in returned outputs"):
MiniCPM-V 4.6's and 4.7's ``target_sizes // 2`` after a size read from a tensor.

The prim's meta takes the boolean promotion here (what every other predicate prim declares, ``ALWAYS_BOOL``). The
traced graph keeps ``aten.floor_divide``; only the fake kernel of the reference's intermediate changes. Seen with
torch 2.13; no upstream issue known; drop it once ``prims.signbit`` is declared ``ALWAYS_BOOL``.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from .registry import patch_attribute, workaround

__all__ = ["promotes_to_input_dtype"]


def promotes_to_input_dtype() -> bool:
    """Whether ``prims.signbit``'s meta takes the default type promotion (the input's dtype): the bug, not yet
    mended in this scope."""
    import torch
    from torch import _prims as prims

    meta = torch.ops.prims.signbit.default.prim_meta_impl
    return getattr(meta, "keywords", {}).get("type_promotion") is prims.ELEMENTWISE_PRIM_TYPE_PROMOTION_KIND.DEFAULT


@workaround(
    id="torch-prims-signbit-dtype",
    backend="all",
    target="torch._prims.signbit (prim_meta_impl: the input's dtype, not bool)",
    breaks="the real-value fallback trace of integer floor division on a tensor with symbolic sizes fails on a "
    "dtype mismatch of torch._refs.floor_divide's signbit (MiniCPM-V 4.6 / 4.7's target_sizes // 2)",
    upstream="torch/_prims/__init__.py signbit (type_promotion=DEFAULT); no issue known",
    versions={"torch": ">=2.9,<2.14"},
    applies=lambda model, inputs: promotes_to_input_dtype(),
)
def _apply(model: Any, inputs: dict):
    import torch
    from torch import _prims as prims

    always_bool = prims.ELEMENTWISE_PRIM_TYPE_PROMOTION_KIND.ALWAYS_BOOL
    return patch_attribute(torch.ops.prims.signbit.default, "prim_meta_impl",
                           partial(prims._prim_elementwise_meta, type_promotion=always_bool))
