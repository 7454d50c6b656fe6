"""ExecuTorch: the edge verifier accepts the Python sym functions ExecuTorch itself maps to its prim ops.

A runtime assert on a data-dependent size (``torch._check(n != 0)`` on a count of real images: Idefics3, Granite
Docling; the token-type and mask arithmetic of GLM-5-Next, ModernVBERT, UltraVBERT) traces as ``torch.sym_not`` /
``torch.sym_ite`` of a comparison. ``to_edge`` maps those Python functions to ``executorch_prim`` ops
(``_PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS``, executorch/exir/passes/executorch_prim_ops_registry.py), but its edge
verifier runs first and refuses every Python function but ``alloc`` (``check_valid_edge_op``, executorch/exir/
verification/verifier.py): a bare ``AssertionError`` and no program. While ``to_edge`` runs, the verifier's set of
accepted sym ops (``_EXECUTORCH_SYM_OPS``) also holds the Python functions the registry maps. The decidable
``sym_max`` / ``sym_min`` of sizes are still resolved first (``executorch-sym-min-max``). Seen with executorch 1.5.1;
no upstream issue known; drop it once the verifier accepts the functions the registry maps.
"""

from __future__ import annotations

import importlib
from typing import Any

from .registry import workaround

__all__: list[str] = []

_VERIFIER = "executorch.exir.verification.verifier"
_REGISTRY = "executorch.exir.passes.executorch_prim_ops_registry"


@workaround(
    id="executorch-python-sym-ops",
    backend="executorch",
    target=f"{_VERIFIER}._EXECUTORCH_SYM_OPS (EXIREdgeDialectVerifier.check_valid_edge_op)",
    breaks="a graph with torch.sym_not / torch.sym_ite (a runtime assert on a data-dependent size: Idefics3, "
    "GLM-5-Next, ModernVBERT) fails in to_edge with a bare AssertionError: the edge verifier refuses the Python "
    "functions ExecuTorch maps to its own prim ops afterwards",
    upstream=f"{_VERIFIER} check_valid_edge_op (only 'alloc' may be a Python function) against "
    f"{_REGISTRY}._PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS; no issue known",
    versions={"executorch": ">=1.0,<1.6"},
)
def _apply(model: Any, inputs: dict):
    accepted = importlib.import_module(_VERIFIER)._EXECUTORCH_SYM_OPS
    mapped = importlib.import_module(_REGISTRY)._PYTHON_SYM_OPS_TO_EXECUTORCH_SYM_OPS
    added = [f for f in mapped if f not in accepted]
    accepted.update(added)
    return lambda: accepted.difference_update(added)
