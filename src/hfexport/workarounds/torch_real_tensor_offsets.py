"""torch.export with real-tensor propagation: a view whose storage offset is data-dependent no longer stops the trace.

Where a model branches on tensor values, the trace is taken again with the sample's real values propagated
(:mod:`hfexport.capture.trace`, as ``torch.export.draft_export`` does). After each op, torch checks the fake output
against the real one (``_check_fake_real_tensors``, torch/_subclasses/fake_utils.py): sizes through the shape
environment, which knows the unbacked symbols' real values, but the storage offset with a plain ``!=``. A slice that
starts at a size read from a tensor (an unbacked ``u53``) has an unbacked offset, and ``!=`` on it is a guard the
trace cannot take: ``GuardOnDataDependentSymNode: Ne(u53, 4096)``, raised by the very fallback meant to get past
such guards. EnCodec's LSTM over its padded frames, MiniCPM-V's per-image slices of its packed patches.

The offset is checked here the way the sizes are: against the real value where the shape environment can evaluate
it, else left to the sizes and the run-time assertions. Seen with torch 2.13; no upstream issue known; drop it once
the offset check is symbolic.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from .registry import patch_attribute, workaround

_MODULE = "torch._subclasses.fake_utils"


def _offset_mismatch(real_offset: int, fake_offset: Any) -> bool:
    """Whether a fake storage offset certainly differs from the real one (a symbolic one is evaluated with the
    shape environment's known values; undecided is no mismatch, as torch decides a symbolic size)."""
    if not isinstance(fake_offset, torch.SymInt):
        return fake_offset != real_offset
    import sympy

    node = fake_offset.node
    env = node.shape_env
    known = env.backed_var_to_val.keys() | env.real_tensor_prop_unbacked_vals.keys()
    if node.expr.free_symbols - known:
        return False
    return env._maybe_evaluate_static(sympy.Eq(node.expr, real_offset), compute_hint=True) is not sympy.S.true


@workaround(
    id="torch-real-tensor-offsets",
    backend="all",
    target=f"{_MODULE}._check_fake_real_tensors",
    breaks="real-tensor propagation compares a data-dependent storage offset with != and raises "
    "GuardOnDataDependentSymNode (Ne(u53, 4096)) in the fallback trace meant to get past such guards: EnCodec, "
    "MiniCPM-V",
    upstream="torch/_subclasses/fake_utils.py _check_fake_real_tensors (storage offsets compared with !=); no issue "
    "known",
    versions={"torch": ">=2.9,<2.14"},
)
def _apply(model: Any, inputs: dict):
    owner = importlib.import_module(_MODULE)

    def check(real_out: torch.Tensor, fake_out: Any, context: str = "", sizes: bool = True, strides: bool = False,
              storage_offset: bool = True, requires_grad: bool = True) -> None:
        if requires_grad and real_out.requires_grad != fake_out.requires_grad:
            raise owner.MetadataMismatchError(f"{context} mismatched requires_grad-ness of outputs")
        if torch._C._has_storage(real_out) and _offset_mismatch(real_out.storage_offset(), fake_out.storage_offset()):
            raise owner.MetadataMismatchError(f"{context} mismatched storage offset")
        torch._prims.utils.compare_tensor_meta(real_out, fake_out, check_sizes=sizes, check_strides=strides,
                                               allow_rhs_unbacked=True)

    return patch_attribute(owner, "_check_fake_real_tensors", check)
