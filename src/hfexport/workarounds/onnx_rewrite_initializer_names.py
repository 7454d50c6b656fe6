"""ONNX: constants a rewrite rule creates under a name another one already has stay registered as initializers.

onnxscript's min/max-to-clip and clip-fusion rules (onnxscript/rewriter/rules/common/_min_max_to_clip.py,
_fuse_relus_clips.py) name the bounds they create ``f"{input}_min"`` / ``f"{input}_max"``: two clamps of one value
(Gemma 4's audio tower clamps each activation to its gradient-clipping bound more than once) make two constants of
one name, the graph keeps only the first as an initializer, and the second is an input no node produces ("Invalid
model. Node input 'mul_8_min' is not a graph input, initializer, or output of a previous node"; after onnx_ir's
DeduplicateInitializersPass, the first's too). After each rewrite pass of hfexport's optimiser, every constant value
a node reads that is neither produced, an input nor a registered initializer is registered, under a fresh name
where its own is taken. Drop it once onnxscript names them uniquely.
"""

from __future__ import annotations

from typing import Any

from .registry import run_after, workaround

__all__ = ["register_orphan_constants"]


def register_orphan_constants(model: Any) -> int:
    """Register every constant input of ``model``'s main graph that no node produces and the graph does not hold as
    an initializer or an input (renamed ``<name>_<n>`` where its name is taken); returns how many."""
    graph = model.graph
    inputs = {id(v) for v in graph.inputs}
    fixed = 0
    for node in graph:
        for value in node.inputs:
            if (value is None or value.producer() is not None or id(value) in inputs or value.const_value is None
                    or graph.initializers.get(value.name) is value):
                continue
            base, n = value.name or "constant", 1
            while value.name in graph.initializers or not value.name:
                value.name = f"{base}_{n}"
                n += 1
            graph.register_initializer(value)
            fixed += 1
    return fixed


@workaround(
    id="onnx-rewrite-initializer-names",
    backend="onnx",
    target="onnxscript.rewriter.RewritePass (rules naming their constants f'{input}_min' / f'{input}_max')",
    breaks="two clamps of one value leave a constant no initializer holds: 'Invalid model. Node input 'mul_8_min' is "
    "not a graph input, initializer, or output of a previous node' (Gemma 4's audio tower)",
    upstream=None,
    versions={"onnxscript": "<=0.7.0"},
)
def _apply(model: Any, inputs: dict):
    from onnxscript.rewriter import RewritePass

    return run_after(RewritePass, "call", lambda result, self, model: register_orphan_constants(model))
