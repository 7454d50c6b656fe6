"""The onnxscript optimiser over an exported graph (``OnnxConfig(optimize=True)``).

The same passes as ``onnxscript.optimizer.optimize``: inline functions, fold constants (with shape inference), the
default rewrite rules, remove what became unused, lift constants into initializers, deduplicate initializers and
common subexpressions, with the no-op rules matching their constants exactly (workaround ``onnx-no-op-tolerance``).
One difference: rules whose pattern has several output nodes are left out. onnxscript matches those by enumerating
every node of the graph for each candidate (``SimplePatternMatcher.match``), which is
quadratic in the graph size: on SmolLM2-135M's decode graph the one such default rule (``SlicesSplit``, two slices
into one ``Split``) took 30 s of the 32 s the optimiser ran, for no measurable gain at run time.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common_passes

__all__ = ["optimize", "default_rules", "OPTIMIZER_WORKAROUNDS"]

#: registered workarounds of the onnxscript rewriter, applied while it runs
OPTIMIZER_WORKAROUNDS = ("onnx-no-op-tolerance", "onnx-rewrite-initializer-names")

logger = logging.getLogger(__name__)


def default_rules() -> list:
    """onnxscript's default rewrite rules whose pattern ends in a single node (linear-time matching)."""
    from onnxscript import rewriter

    rules = getattr(rewriter, "_DEFAULT_REWRITE_RULES", None)
    if rules is None:  # a future onnxscript without the private list: its public common rules, minus the quadratic
        from onnxscript.rewriter.rules import common

        rules = [getattr(common, name) for name in common.__all__ if name != "slice_split_rule"]
    return [rule for rule in rules if _single_output(rule)]


def _single_output(rule) -> bool:
    pattern = getattr(rule, "_target_pattern", None)
    return bool(getattr(pattern, "has_single_output_node", True))


def optimize(model: ir.Model, num_iterations: int = 2) -> ir.Model:
    """Optimise ``model`` in place (and return it).

    Example:
        >>> optimize(exported.program)  # already done by OnnxConfig(optimize=True)
    """
    from ...workarounds.registry import applied_workarounds

    start = time.perf_counter()
    # constant folding evaluates e.g. log(0) in T5's position buckets, as torch does
    with np.errstate(all="ignore"), applied_workarounds(None, model, {}, ids=OPTIMIZER_WORKAROUNDS):
        _optimize(model, num_iterations)
    logger.info("onnxscript optimiser: %d nodes in %.1fs", len(model.graph), time.perf_counter() - start)
    return model


def _optimize(model: ir.Model, num_iterations: int) -> None:
    from onnxscript.optimizer import fold_constants_ir
    from onnxscript.rewriter import RewritePass

    common_passes.InlinePass()(model)
    rewrite = RewritePass(default_rules())
    cleanup = ir.passes.Sequential(
        common_passes.RemoveUnusedNodesPass(),
        common_passes.RemoveUnusedFunctionsPass(),
        common_passes.RemoveUnusedOpsetsPass(),
    )
    for _ in range(num_iterations):
        modified = fold_constants_ir(model, onnx_shape_inference=True).modified
        modified = rewrite(model).modified or modified
        cleanup(model)
        if not modified:
            break
    ir.passes.Sequential(
        common_passes.RemoveUnusedNodesPass(),
        common_passes.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common_passes.LiftSubgraphInitializersToMainGraphPass(),
        common_passes.DeduplicateInitializersPass(),
        common_passes.CommonSubexpressionEliminationPass(),
    )(model)
