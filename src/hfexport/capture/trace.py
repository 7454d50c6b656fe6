"""``torch.export`` of one prepared graph, and its one fallback for code that branches on tensor values.

Where the trace stops on a guard it cannot decide from shapes (``GuardOnDataDependentSymNode``: a branch on
``mask.any()``, a size read from a tensor), and the backend's runtime checks the runtime assertions a program
carries (:attr:`~hfexport.exporter.HfExporter.checks_runtime_asserts`: the ``ExportedProgram`` of Dynamo), the
graph is traced again with the sample's real values propagated
(``torch._functorch.config.fake_tensor_propagate_real_tensors``, what ``torch.export.draft_export`` does): each
undecidable guard takes the sample's branch and becomes a runtime assertion of the program. An input that takes
another branch then fails with :class:`~hfexport.errors.UnsupportedError` naming the assumption, instead of giving
another branch's result. Backends whose lowering drops runtime assertions (ONNX, OpenVINO, ExecuTorch) keep the
trace's own error, and so does AOTInductor for now: Inductor 2.13 fails to compile Longformer's assertions
(``InductorError: unsupported operand type(s) for -: 'Equality' and 'Equality'``).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["assumptions_of", "trace_program"]

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


def assumptions_of(program: Any) -> list[str]:
    """The data-dependent expressions a program asserts at run time (``u0 <= 1``, ``Ne(u0, 1)``), in graph order."""
    assert_scalar = torch.ops.aten._assert_scalar.default
    found = []
    for node in program.graph.nodes:
        if node.target is assert_scalar and len(node.args) > 1 and isinstance(node.args[1], str):
            message = node.args[1]
            found.append(message.split("for expression ", 1)[-1].split(" on node ", 1)[0])
    return found


def trace_program(model: torch.nn.Module, inputs: Mapping[str, Any], dynamic_shapes: Any, config: Any, *,
                  checks_runtime_asserts: bool) -> Any:
    """``torch.export.export`` of ``model`` on ``inputs``; on a data-dependent guard, the fallback of the module's
    docstring where ``checks_runtime_asserts`` (else the error as it is)."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    try:
        return _export(model, inputs, dynamic_shapes, config)
    except GuardOnDataDependentSymNode as first:
        if not checks_runtime_asserts:
            raise
        reason = str(first).strip().splitlines()[0][:160]
        import torch._functorch.config as functorch_config

        try:
            with functorch_config.patch(fake_tensor_propagate_real_tensors=True):
                program = _export(model, inputs, dynamic_shapes, config)
            with torch.no_grad():  # its assumptions must hold on the sample itself (the values the real-tensor
                program.module()(**copy.deepcopy(dict(inputs)))  # run saw can differ: uninitialised memory)
        except Exception:  # noqa: BLE001 - the fallback did not help: the trace's own error says more
            raise first from None
    held = assumptions_of(program)
    logger.warning(
        "%s branches on tensor values (%s): traced with the sample's values, the program asserts at run time: %s",
        type(model).__name__, reason, "; ".join(held) or "nothing")
    return program
