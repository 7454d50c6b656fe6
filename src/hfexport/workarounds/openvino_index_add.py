"""OpenVINO: ``aten.index_add`` from ``torch.export`` becomes a ``scatter_add`` before conversion.

``aten::index_add(self, dim, index, source, *, alpha=1)``: ``torch.export`` leaves the keyword-only ``alpha`` out
of the FX node when it is the default, and the PyTorch frontend's translator requires it as a fifth input ("Got less
inputs 4 than expected 5"), so no exported ``index_add`` converts (openvinotoolkit/openvino#35628; fix proposed in
#36601). Packed vision towers have one (``hfexport.workarounds.models.packed_vision_attention`` numbers the patches' images with
it). This wraps ``openvino.convert_model`` to decompose every ``index_add`` of the program into the same
``scatter_add`` the translator would build (the index broadcast over ``source``, ``source`` scaled by ``alpha``).
Drop it once the frontend defaults ``alpha`` (openvino > 2026.3 with #36601 merged).
"""

from __future__ import annotations

from typing import Any

from .openvino_convert import rewrite_program_before_convert
from .registry import workaround

__all__ = ["index_add_as_scatter_add", "decompose_index_add"]


def index_add_as_scatter_add(self: Any, dim: int, index: Any, source: Any, alpha: Any = 1) -> Any:
    """``self.index_add(dim, index, source, alpha=alpha)`` written with ``scatter_add`` (same result)."""
    if source.dim() == 0:
        source = source.reshape(1)
    shape = [1] * source.dim()
    shape[dim] = -1
    if alpha != 1:
        source = source * alpha
    return self.scatter_add(dim, index.reshape(shape).expand_as(source), source)


def _has_index_add(program: Any) -> bool:
    import torch

    from ..capture.graph_passes import calls_to

    return bool(calls_to(program, (torch.ops.aten.index_add.default, torch.ops.aten.index_add_.default)))


def decompose_index_add(program: Any) -> Any:
    """``program`` with every ``aten.index_add`` rewritten as ``scatter_add`` (a new ``ExportedProgram``), or
    ``program`` itself when it has none."""
    import torch

    if not _has_index_add(program):
        return program
    return program.run_decompositions({torch.ops.aten.index_add.default: index_add_as_scatter_add})


@workaround(
    id="openvino-index-add",
    backend="openvino",
    target="openvino.convert_model (aten.index_add of an ExportedProgram)",
    breaks="an exported aten.index_add does not convert: torch.export leaves out the default alpha and the "
    "PyTorch frontend requires it ('Got less inputs 4 than expected 5'); Qwen2-VL's vision tower has one",
    upstream="https://github.com/openvinotoolkit/openvino/issues/35628",
    versions={"openvino": ">=2024.0,<2027"},
)
def _apply(model: Any, inputs: dict):
    return rewrite_program_before_convert(decompose_index_add)
