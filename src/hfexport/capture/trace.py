"""``torch.export`` of one prepared graph, and its one fallback for code that branches on tensor values.

Where the trace stops on a guard it cannot decide from shapes (``GuardOnDataDependentSymNode``: a branch on
``mask.any()``, a size read from a tensor), the graph is traced again with the sample's real values propagated
(``torch._functorch.config.fake_tensor_propagate_real_tensors``, what ``torch.export.draft_export`` does): each
undecidable guard takes the sample's branch and becomes a runtime assertion of the program. An input that takes
another branch then fails with :class:`~hfexport.errors.UnsupportedError` naming the assumption, instead of giving
another branch's result. Where the backend's runtime checks the assertions a program carries
(:attr:`~hfexport.exporter.HfExporter.checks_runtime_asserts`: the ``ExportedProgram`` of Dynamo) they stay as they
are; elsewhere (ONNX, OpenVINO, ExecuTorch drop them while lowering; Inductor 2.13 fails to compile Longformer's,
``unsupported operand type(s) for -: 'Equality' and 'Equality'``) each becomes a boolean output that the runner
checks after the call (:mod:`.assumptions`).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import torch

from .assumptions import assumptions_as_outputs, assumptions_of, fake_mode_of

__all__ = ["lowering_scope", "trace_program"]

logger = logging.getLogger(__name__)


def _export(model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any, config: Any) -> Any:
    return torch.export.export(
        model,
        args=(),
        kwargs=dict(inputs),
        dynamic_shapes=dynamic_shapes,
        strict=config.strict,
        prefer_deferred_runtime_asserts_over_guards=config.prefer_deferred_runtime_asserts_over_guards,
    )


def trace_program(model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any, config: Any, *,
                  checks_runtime_asserts: bool) -> tuple[Any, list[str]]:
    """``torch.export.export`` of ``model`` on ``inputs``, with the fallback of the module's docstring on a
    data-dependent guard; returns the program and the assumptions it returns as boolean outputs (empty where it
    traced without the fallback, or where ``checks_runtime_asserts`` keeps them as runtime assertions)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        return _export(model, inputs, dynamic_shapes, config), []
    except GuardOnDataDependentSymNode as first:
        reason = str(first).strip().splitlines()[0][:160]
        import torch._functorch.config as functorch_config

        try:
            with functorch_config.patch(fake_tensor_propagate_real_tensors=True,
                                        generate_fake_kernels_from_real_mismatches=True):
                program = _export(model, inputs, dynamic_shapes, config)
            with torch.no_grad():  # its assumptions must hold on the sample itself (the values the real-tensor
                program.module()(**copy.deepcopy(dict(inputs)))  # run saw can differ: uninitialised memory)
        except Exception:  # noqa: BLE001 - the fallback did not help: the trace's own error says more
            raise first from None
    held = assumptions_of(program)
    logger.warning(
        "%s branches on tensor values (%s): traced with the sample's values, the program %s: %s",
        type(model).__name__, reason,
        "asserts at run time" if checks_runtime_asserts else "returns as checks its runner makes after each call",
        "; ".join(held) or "nothing")
    return program, ([] if checks_runtime_asserts else assumptions_as_outputs(program))



def lowering_scope(program: Any) -> Any:
    """Where ``program`` was traced with the sample's real values, its fake mode keeps propagating them: a lowering
    that traces it again (ONNX's and ExecuTorch's decompositions) runs each op on the real values too, and needs
    them to decide the sizes read from tensors (``2*u20 - 1 < 0``, LED). Where a fake kernel and the real one
    disagree on aliasing there ("Real tensor propagation found mismatch in outputs_alias_inputs"), the scope lets
    torch take the real kernel's answer, as ``torch.export.draft_export`` does; elsewhere it changes nothing."""
    import contextlib

    fake_mode = fake_mode_of(program)
    if fake_mode is None or not getattr(fake_mode, "propagate_real_tensors", False):
        return contextlib.nullcontext()
    import torch._functorch.config as functorch_config

    return functorch_config.patch(generate_fake_kernels_from_real_mismatches=True)
