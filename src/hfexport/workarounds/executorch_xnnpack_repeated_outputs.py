"""ExecuTorch / XNNPACK: a delegated subgraph that its own passes leave returning one node twice returns a copy the
second time.

XNNPACK's backend runs its passes on each partition before serializing it (``XNNPACKPassManager`` in
``xnnpack_preprocess.py``); where two of the partition's outputs compute the same value (PE Audio's encoder returns a
``permute`` of the same tensor for two fields), the passes merge them and the partition returns one node twice
(``return [mul, permute_copy_1, permute_copy_1]``). ``generate_node_to_external_map`` then refuses the repeat as if
it were a pass-through input ("Output node 'aten_permute_copy_default_1' is already in the inputs ... pass through
arguments, which are not supported", executorch 1.5.1): the whole export failed (PE Audio / Video and their
encoders, CLVP). After the passes, each repeat becomes an ``aten.clone`` of the node, which XNNPACK lowers as a copy
into an external output of its own. Drop it once the preprocessing keeps repeated outputs apart.
"""

from __future__ import annotations

from typing import Any

from .registry import patch_attribute, workaround

__all__ = ["copy_repeated_outputs"]


def copy_repeated_outputs(program: Any) -> int:
    """Replace every repeat in the output list of ``program`` (an edge ``ExportedProgram``) by an ``aten.clone`` of
    it, its signature entry renamed to match, in place; returns how many."""
    from executorch.exir.dialects._ops import ops as exir_ops

    from ..capture.graph_passes import separate_repeated_outputs

    return separate_repeated_outputs(
        program, lambda graph, value: graph.call_function(exir_ops.edge.aten.clone.default, (value,)))


@workaround(
    id="executorch-xnnpack-repeated-outputs",
    backend="executorch",
    target="executorch.backends.xnnpack.xnnpack_preprocess (XNNPACKPassManager, generate_node_to_external_map)",
    breaks="a partition whose XNNPACK passes merge two of its outputs into one node fails to lower: 'Output node ... "
    "is already in the inputs' (PE Audio / Video, CLVP)",
    upstream="executorch backends/xnnpack/xnnpack_preprocess.py; no issue known",
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply(model: Any, inputs: dict):
    from executorch.backends.xnnpack import xnnpack_preprocess

    original = xnnpack_preprocess.XNNPACKPassManager

    class PassManager(original):  # type: ignore[misc, valid-type]
        def transform(self, *args: Any, **kwargs: Any) -> Any:
            program = super().transform(*args, **kwargs)
            copy_repeated_outputs(program)
            return program

    return patch_attribute(xnnpack_preprocess, "XNNPACKPassManager", PassManager)
