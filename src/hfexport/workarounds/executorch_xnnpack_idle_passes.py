"""ExecuTorch / XNNPACK: a preprocessing pass with nothing to rewrite in a partition is not run on it.

XNNPACK's backend runs 17 passes over each partition before serializing it (``XNNPACKPassManager`` in
``xnnpack_preprocess.py``). Most of them override ``call`` to rewrite the ops they are about, then retrace the whole
partition with fake tensors (``super().call(graph_module)``, "to regenerate metadata") and report it modified
whether or not they rewrote anything, so ``_transform`` rebuilds the program too. SmolLM2-135M's static-cache export
has 34 partitions: its 17 x 34 retraces were 191 s of its 485 s lowering under cProfile, and nine of the passes find
nothing to rewrite in a language model (batch norm twice, 1-d convolution, PReLU, bilinear upsampling, the SDPA
pattern, a concatenation of more than five inputs, activations to fuse, quantize / dequantize nodes). Measured
without the profiler (2026-12-07, 2 cores, nothing else running): SmolLM2's export 208 -> 191 s
(``to_edge_and_lower`` 182 -> 161 s), the tiny Gemma 3's 42 -> 33 s, the tiny Whisper's 50 -> 42 s; the ``.pte``
the same, byte for byte, in each.

Each such pass first checks, on the partition as it stands when its turn comes, for the ops its own ``call``
rewrites; where there are none it returns the partition unchanged (``modified=False``), as the upstream loop would
have after a retrace that changes nothing. A pattern pass (SDPA, bilinear upsampling) is skipped only where some op
of every one of its patterns is missing from the partition, since ``SubgraphMatcher`` matches each pattern node to a
node of the same target. What the passes write is unchanged: tests/test_executorch_idle_passes.py compares the
serialized programs with and without. Drop it once the passes report ``modified=False`` without retracing.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from .registry import patch_attribute, undo_all, workaround

__all__ = ["IDLE_CHECKS", "has_work"]


def _targets(graph_module: Any) -> set:
    return {n.target for n in graph_module.graph.nodes if n.op == "call_function"}


def _named(graph_module: Any, name: str) -> list:
    return [n for n in graph_module.graph.nodes
            if n.op == "call_function" and getattr(n.target, "__name__", None) == name]


def _any_target(ops: Callable[[], Any]) -> Callable[[Any], bool]:
    return lambda graph_module: not _targets(graph_module).isdisjoint(ops())


def _any_pattern(graphs: Callable[[], Any]) -> Callable[[Any], bool]:
    """Whether every op of at least one of the patterns ``graphs()`` is in the partition (a match needs them all).
    The patterns' op sets are computed once per process: XNNPACK's SDPA patterns are not cached upstream
    (``sdpa.get_graphs`` exports and lowers two programs each call, ~0.4 s), and the check runs per partition."""
    @functools.cache
    def pattern_ops() -> tuple[frozenset, ...]:
        return tuple(frozenset(_targets(pattern)) for pattern in graphs())

    def check(graph_module: Any) -> bool:
        present = _targets(graph_module)
        return any(ops <= present for ops in pattern_ops())

    return check


def _quant_nodes(graph_module: Any) -> bool:
    from executorch.backends.xnnpack.utils.quant_utils import is_dequant, is_quant

    return any(is_quant(n) or is_dequant(n) for n in graph_module.graph.nodes)


def _wide_cat(graph_module: Any) -> bool:
    return any(len(n.args[0]) > 5 for n in _named(graph_module, "aten.cat.default"))


def _edge(name: str) -> Callable[[], set]:
    def ops() -> set:
        from executorch.exir.dialects._ops import ops as exir_ops

        return {getattr(getattr(exir_ops.edge.aten, name.split(".")[0]), name.split(".")[1])}

    return ops


def _batch_norms() -> set:
    from executorch.backends.xnnpack._passes.decompose_batch_norm import DecomposeBatchNorm

    return set(DecomposeBatchNorm.BATCH_NORM_OPS)


def _activations() -> set:
    from executorch.backends.xnnpack._passes.fuse_activation_pass import FuseActivationPass

    return set(FuseActivationPass.FUSEABLE_ACTIVATIONS)


def _sdpa_graphs() -> Any:
    from executorch.backends.xnnpack.partition.graphs import sdpa

    return sdpa.get_graphs()


def _bilinear_graphs() -> Any:
    from executorch.backends.xnnpack.partition.graphs import bilinear_2d

    return bilinear_2d.get_graphs()


# (module under executorch.backends.xnnpack._passes, class) -> whether the partition holds what its call rewrites,
# as that call tests it
IDLE_CHECKS: dict[tuple[str, str], Callable[[Any], bool]] = {
    ("convert_to_upsample_bilinear2d", "ConvertToUpsampleBilinear2d"): _any_pattern(_bilinear_graphs),
    ("convert_to_sdpa", "ConvertToSDPAPass"): _any_pattern(_sdpa_graphs),
    ("propagate_custom_meta_pass", "PropagateCustomMetaPass"): _quant_nodes,
    ("fuse_batch_norm", "FuseBatchNormPass"): _any_target(_batch_norms),
    ("decompose_batch_norm", "DecomposeBatchNorm"): _any_target(_batch_norms),
    ("fuse_activation_pass", "FuseActivationPass"): _any_target(_activations),
    ("decompose_cat", "DecomposeConcatenate"): _wide_cat,
    ("conv1d_unsqueeze_pass", "Conv1dUnsqueezePass"): lambda gm: bool(_named(gm, "aten.convolution.default")),
    ("prelu_reshape_pass", "PReLUReshapePass"): _any_target(_edge("_prelu_kernel.default")),
}


def has_work(module: str, name: str, graph_module: Any) -> bool:
    """Whether the XNNPACK pass ``name`` (of ``executorch.backends.xnnpack._passes.<module>``) has something to
    rewrite in ``graph_module``; True for a pass without a check."""
    check = IDLE_CHECKS.get((module, name))
    return True if check is None else bool(check(graph_module))


def _guarded(module: str, name: str, original: Any) -> Any:
    def call(self: Any, graph_module: Any) -> Any:
        if has_work(module, name, graph_module):
            return original(self, graph_module)
        from torch.fx.passes.infra.pass_base import PassResult

        return PassResult(graph_module, False)

    return call


@workaround(
    id="executorch-xnnpack-idle-passes",
    backend="executorch",
    target="executorch.backends.xnnpack._passes (ConvertToSDPAPass, FuseBatchNormPass, Conv1dUnsqueezePass, ... "
    "call: super().call(graph_module) and PassResult(graph_module, True) whatever they rewrote)",
    breaks="nothing wrong, only slow: every XNNPACK pass retraces every partition, nine of them with nothing to "
    "rewrite in a language model (SmolLM2-135M's lowering 182 s -> 161 s without those retraces, 34 partitions)",
    upstream="executorch backends/xnnpack/_passes/*.py; no issue known",
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply(model: Any, inputs: dict):
    import importlib

    undos = []
    for module, name in IDLE_CHECKS:
        owner = getattr(importlib.import_module(f"executorch.backends.xnnpack._passes.{module}"), name)
        undos.append(patch_attribute(owner, "call", _guarded(module, name, vars(owner)["call"])))
    return undo_all(undos)
