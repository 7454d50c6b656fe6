"""The ways an ExecuTorch workaround rewrites a program: a traced one before ``to_edge`` (wrap
``executorch.exir.to_edge_transform_and_lower``, looked up at call time by the lowering, so that each program it is
given goes through a pass first), and the edge programs before ``to_executorch`` (not a workaround itself; see the
``executorch_*`` modules that use them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import Undo, patch_attribute

__all__ = ["rewrite_edge_programs_before_to_executorch", "rewrite_programs_before_to_edge"]


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


def rewrite_edge_programs_before_to_executorch(rewrite: Callable[[Any], Any]) -> Undo:
    """Wrap ``EdgeProgramManager.to_executorch`` so that each of its edge programs goes through ``rewrite`` (in
    place) first; the returned undo restores the original."""
    from executorch.exir.program._program import EdgeProgramManager

    original = EdgeProgramManager.to_executorch

    def to_executorch(self: Any, *args: Any, **kwargs: Any) -> Any:
        for program in self._edge_programs.values():
            rewrite(program)
        return original(self, *args, **kwargs)

    return patch_attribute(EdgeProgramManager, "to_executorch", to_executorch)
