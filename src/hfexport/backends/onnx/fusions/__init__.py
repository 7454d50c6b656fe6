"""Fusions into ONNX Runtime's contrib ops for one execution provider (``OnnxConfig(ort_fusions=...)``).

The steps, in order (each counts what it fused, recorded in the model's ``metadata_props``):

- ``rms_norm`` / ``skip_rms_norm`` / ``skip_layer_norm``: onnxscript's fusions into ``SimplifiedLayerNormalization``,
  ``SkipSimplifiedLayerNormalization`` and ``SkipLayerNormalization`` (residual add + norm in one kernel).
- ``rotary``: rotary embeddings into ``RotaryEmbedding`` (:mod:`.rotary`).
- ``attention``: attention over the KV cache into ``GroupQueryAttention``, which updates the cache itself
  (:mod:`.attention`).
- ``packed_matmul``: sibling projections (Q/K/V, gate/up) into one ``MatMul`` (:mod:`.packing`).
- ``gelu``: onnxscript's GELU fusions (``Gelu``, ``FastGelu``, ``BiasGelu``).
- ``fused_matmul``: onnxscript's ``FusedMatMul`` rules (transposes and scales folded into the matmul).
- ``reshapes``: the back-to-back ``Reshape``s the fusions leave around the contrib ops collapse (:mod:`.reshapes`).

Then the optimiser runs again, so the transposes and reshapes the fusions left unused or back-to-back go away, and
``reshapes`` once more on what its folding exposed. The fused graph runs on ONNX Runtime only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

import onnx_ir as ir

__all__ = ["fuse_for_onnxruntime", "TARGETS"]

logger = logging.getLogger(__name__)

TARGETS = ("cpu", "cuda", "webgpu", "dml")
METADATA_KEY = "hfexport.ort_fusions"


def _onnxscript(name: str) -> Callable[[ir.Model], int]:
    def run(model: ir.Model) -> int:
        from onnxscript.rewriter.ort_fusions import bias_gelu, erfgelu, gelu, rms_normalization, skip_normalization

        functions = {
            "rms_norm": [rms_normalization.fuse_rms_normalization],
            "skip_rms_norm": [skip_normalization.fuse_skip_rms_normalization],
            "skip_layer_norm": [skip_normalization.fuse_skip_layer_normalization],
            "gelu": [erfgelu.fuse_erfgelu, gelu.fuse_gelu, bias_gelu.fuse_bias_gelu],
        }[name]
        return sum(fn(model) for fn in functions)

    return run


def _fused_matmul(model: ir.Model) -> int:
    from onnxscript.rewriter import rewrite
    from onnxscript.rewriter.ort_fusions import fused_matmul_rule_sets

    before = sum(1 for n in model.graph if n.op_type == "FusedMatMul")
    rewrite(model, list(fused_matmul_rule_sets.fused_matmul_rule_sets()))
    return sum(1 for n in model.graph if n.op_type == "FusedMatMul") - before


def _steps() -> list[tuple[str, Callable[[ir.Model], int]]]:
    from .attention import fuse_group_query_attention
    from .packing import pack_sibling_matmuls
    from .reshapes import collapse_reshapes
    from .rotary import fuse_rotary_embeddings

    return [
        ("rms_norm", _onnxscript("rms_norm")),
        ("skip_rms_norm", _onnxscript("skip_rms_norm")),
        ("skip_layer_norm", _onnxscript("skip_layer_norm")),
        ("rotary", fuse_rotary_embeddings),
        ("attention", fuse_group_query_attention),
        ("packed_matmul", pack_sibling_matmuls),
        ("gelu", _onnxscript("gelu")),
        ("fused_matmul", _fused_matmul),
        ("reshapes", collapse_reshapes),
    ]


def fuse_for_onnxruntime(model: ir.Model, target: str) -> dict[str, int]:
    """Fuse ``model`` in place for ONNX Runtime's ``target`` execution provider; returns the count per step.

    Example:
        >>> counts = fuse_for_onnxruntime(model, "cpu")
        >>> counts["attention"]
        30
    """
    if target not in TARGETS:
        raise ValueError(f"ort_fusions must be one of {TARGETS}, got {target!r}")
    from ..optimize import optimize

    counts = {}
    for name, step in _steps():
        counts[name] = int(step(model))
    optimize(model)
    # the optimiser's folding exposes more reshape pairs (and reshapes to the input's own shape): one more round
    from onnx_ir.passes.common import RemoveUnusedNodesPass

    from .reshapes import collapse_reshapes

    late = collapse_reshapes(model)
    if late:
        RemoveUnusedNodesPass()(model)
        counts["reshapes"] += late
    model.metadata_props[METADATA_KEY] = json.dumps({"target": target, **counts})
    logger.info("ONNX Runtime fusions for %s: %s", target, counts)
    return counts
