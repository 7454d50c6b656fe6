"""ExecuTorch: copying a constant that two delegated partitions share no longer re-verifies the whole program.

Before lowering, ``to_edge_transform_and_lower`` gives each XNNPACK partition its own copy of a constant that
several partitions read (``_maybe_duplicate_constant_nodes`` -> ``duplicate_constant_node``,
executorch/exir/backend/canonical_partitioners/duplicate_constant_node_pass.py). Each copy ends with
``exported_program._validate()``, which runs the edge verifier over every node of the program, its dtype check of
each op's arguments included: one copy per shared constant, so the lowering is quadratic in the program's size. It
only adds placeholders and rewires their users; no op changes. HRM's tiny model (51 partitions, 32 copies) spent
29.6 of its 154 s of ExecuTorch export there; the matrix's ExecuTorch rows of the larger tiny models timed out on it.

The copies here skip that validation; the program the lowering builds from them is validated when it is made
(``to_backend``'s ``ExportedProgram``), once. Seen with executorch 1.5.1; no upstream issue known; drop it once the
pass validates once per lowering.
"""

from __future__ import annotations

import importlib
from typing import Any

from .registry import patch_attribute, workaround

_MODULE = "executorch.exir.backend.utils"


@workaround(
    id="executorch-duplicate-validation",
    backend="executorch",
    target=f"{_MODULE}.duplicate_constant_node",
    breaks="every constant shared by two delegated partitions is copied with a full edge verification of the "
    "program after each copy: the lowering is quadratic in the program's size (HRM: 30 of 154 s)",
    upstream="executorch/exir/backend/canonical_partitioners/duplicate_constant_node_pass.py duplicate_constant_node "
    "(exported_program._validate() per copied constant); no issue known",
    versions={"executorch": ">=1.0,<1.6"},
)
def _apply(model: Any, inputs: dict):
    owner = importlib.import_module(_MODULE)
    original = owner.duplicate_constant_node

    def duplicate_constant_node(exported_program: Any, candidate_node: str) -> Any:
        exported_program._validate = _skip  # (an instance attribute: this program only, for this call)
        try:
            return original(exported_program, candidate_node)
        finally:
            del exported_program._validate

    return patch_attribute(owner, "duplicate_constant_node", duplicate_constant_node)


def _skip() -> None:
    """Validation left to the program the lowering builds from the copies."""
