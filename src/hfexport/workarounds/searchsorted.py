"""ONNX, OpenVINO, ExecuTorch: ``torch.searchsorted`` traced as a count of the sorted values below each value.

``aten.searchsorted.Tensor`` has no translation in the ONNX exporter ("No ONNX function found for
aten.searchsorted.Tensor"; ONNX has no such operator), no conversion rule in OpenVINO's PyTorch frontend (2026.3.1),
and is not in ExecuTorch's Core ATen opset (``to_edge`` refuses it). Music Flamingo builds its audio frames'
timestamps with it (``_build_audio_timestamps``: which clip each encoder row belongs to), so neither its export nor
its audio features lowered. For a sorted ``sorted_sequence`` the insertion index of a value is how many entries lie
below it (``<``; ``<=`` for ``right=True`` / ``side="right"``), along the last axis, which is what ``searchsorted``
returns: while tracing for these backends it is computed that way (a comparison against every entry and a sum,
exact; ``[..., N, M]`` booleans for ``N`` values and ``M`` entries). Calls with a ``sorter`` or ``out`` keep
torch's own. Drop each once its backend converts ``searchsorted``. (ExecuTorch's ``bucketize``, the same search over
1-D boundaries: :mod:`.executorch_bucketize`.)
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import modeling_code_names, patch_attribute, register_for_backends

__all__ = ["searchsorted_by_counting"]


def searchsorted_by_counting(sorted_sequence: torch.Tensor, values: torch.Tensor, *, out_int32: bool = False,
                             right: bool = False) -> torch.Tensor:
    """``torch.searchsorted(sorted_sequence, values, out_int32=out_int32, right=right)`` for a tensor of values:
    1-D ``sorted_sequence`` searched for every value, or one row of it per leading index of ``values``."""
    entries = sorted_sequence if sorted_sequence.dim() == 1 else sorted_sequence.unsqueeze(-2)  # [..., 1, M]
    probe = values.unsqueeze(-1).to(torch.promote_types(values.dtype, sorted_sequence.dtype))
    below = entries <= probe if right else entries < probe
    return below.sum(-1, dtype=torch.int32 if out_int32 else torch.int64)


def _searchsorted(original: Any) -> Any:
    def searchsorted(sorted_sequence: Any, values: Any, *args: Any, out_int32: bool = False, right: bool = False,
                     side: str | None = None, sorter: Any = None, **kwargs: Any) -> Any:
        if (args or kwargs or sorter is not None or not isinstance(values, torch.Tensor)
                or not isinstance(sorted_sequence, torch.Tensor) or values.dim() == 0):
            return original(sorted_sequence, values, *args, out_int32=out_int32, right=right, side=side,
                            sorter=sorter, **kwargs)
        return searchsorted_by_counting(sorted_sequence, values, out_int32=out_int32,
                                        right=right or side == "right")

    return searchsorted


def _apply(model: Any, inputs: dict):
    return patch_attribute(torch, "searchsorted", _searchsorted(torch.searchsorted))


register_for_backends("searchsorted", _apply, lambda model, inputs: modeling_code_names(model, "searchsorted"), (
    ("onnx", {"onnxscript": "<=0.7.0"}, "torch.onnx: aten.searchsorted.Tensor (no ONNX function, no operator)",
     "the exported program does not convert: 'No ONNX function found for aten.searchsorted.Tensor' (Music "
     "Flamingo's audio timestamps)"),
    ("openvino", {"openvino": ">=2024.0,<2027"}, "OpenVINO PyTorch frontend: aten.searchsorted.Tensor",
     "no conversion rule for aten.searchsorted.Tensor (Music Flamingo's audio timestamps)"),
    ("executorch", {"executorch": ">=0.6,<1.6"}, "ExecuTorch to_edge: aten.searchsorted.Tensor (not Core ATen)",
     "to_edge refuses the program: 'Operator torch._ops.aten.searchsorted.Tensor is not in Core ATen opset' (Music "
     "Flamingo's audio timestamps)"),
))
