"""The way an ExecuTorch workaround rewrites a traced program before ``to_edge``: wrap
``executorch.exir.to_edge_transform_and_lower`` (looked up at call time by the lowering) so that each program it is
given goes through a pass first (not a workaround itself; see the ``executorch_*`` modules that use it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import Undo, patch_attribute

__all__ = ["rewrite_programs_before_to_edge"]


def rewrite_programs_before_to_edge(rewrite: Callable[[Any], Any]) -> Undo:
    """Wrap ``executorch.exir.to_edge_transform_and_lower`` so that every ``ExportedProgram`` it gets (one, or a
    dict of methods) goes through ``rewrite`` first: in place, or returning the program to lower instead (a
    decomposition's new program); the returned undo restores the original."""
    import executorch.exir
    import torch

    original = executorch.exir.to_edge_transform_and_lower

    def rewritten(program: Any) -> Any:
        result = rewrite(program)
        return result if isinstance(result, torch.export.ExportedProgram) else program

    def to_edge_transform_and_lower(programs: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(programs, dict):
            programs = {name: rewritten(program) for name, program in programs.items()}
        else:
            programs = rewritten(programs)
        return original(programs, *args, **kwargs)

    return patch_attribute(executorch.exir, "to_edge_transform_and_lower", to_edge_transform_and_lower)
