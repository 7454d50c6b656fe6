"""The two ways an OpenVINO workaround changes ``openvino.convert_model``: a rewrite of the ``ExportedProgram``
before the PyTorch frontend reads it, or of the ``openvino.Model`` it returns (not a workaround itself; see the
``openvino_*`` modules that use them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import Undo, patch_attribute

__all__ = ["rewrite_program_before_convert", "rewrite_model_after_convert"]


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
