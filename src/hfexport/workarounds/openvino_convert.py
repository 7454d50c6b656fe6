"""The ways an OpenVINO workaround changes ``openvino.convert_model``: a rewrite of the ``ExportedProgram`` before
the PyTorch frontend reads it, of the program its own ``run_decompositions`` returns while it converts, or of the
``openvino.Model`` it returns (not a workaround itself; see the ``openvino_*`` modules that use them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import Undo, patch_attribute

__all__ = ["rewrite_program_before_convert", "rewrite_model_after_convert", "rewrite_decomposed_programs"]


def rewrite_program_before_convert(rewrite: Callable[[Any], Any]) -> Undo:
    """Wrap ``openvino.convert_model`` so that an ``ExportedProgram`` goes through ``rewrite`` first (it returns the
    program to convert, or changes it in place and returns anything else, e.g. a count); the returned undo restores
    the original."""
    import openvino
    import torch

    original = openvino.convert_model

    def convert_model(input_model: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(input_model, torch.export.ExportedProgram):
            rewritten = rewrite(input_model)  # (an in-place pass returns its count)
            input_model = rewritten if isinstance(rewritten, torch.export.ExportedProgram) else input_model
        return original(input_model, *args, **kwargs)

    return patch_attribute(openvino, "convert_model", convert_model)


def rewrite_model_after_convert(rewrite: Callable[[Any], Any]) -> Undo:
    """Wrap ``openvino.convert_model`` so that the ``openvino.Model`` it returns goes through ``rewrite`` (in place)
    before the caller sees it; the returned undo restores the original."""
    import openvino

    original = openvino.convert_model

    def convert_model(*args: Any, **kwargs: Any) -> Any:
        converted = original(*args, **kwargs)
        rewrite(converted)
        return converted

    return patch_attribute(openvino, "convert_model", convert_model)


def rewrite_decomposed_programs(rewrite: Callable[[Any], Any]) -> Undo:
    """Wrap ``openvino.convert_model`` so that, while it runs, each ``ExportedProgram.run_decompositions`` result
    (the frontend's own decomposition, which writes size nodes again from the shape expressions: the runtime
    asserts' ``u ** 2``, a view's ``-((-n) // k)``) goes through ``rewrite`` in place; the returned undo restores the
    original."""
    import openvino
    import torch

    original_convert = openvino.convert_model

    def convert_model(*args: Any, **kwargs: Any) -> Any:
        program_class = torch.export.ExportedProgram
        original_run = program_class.run_decompositions

        def run_decompositions(self: Any, *a: Any, **k: Any) -> Any:
            decomposed = original_run(self, *a, **k)
            rewrite(decomposed)
            return decomposed

        undo = patch_attribute(program_class, "run_decompositions", run_decompositions)
        try:
            return original_convert(*args, **kwargs)
        finally:
            undo()

    return patch_attribute(openvino, "convert_model", convert_model)
