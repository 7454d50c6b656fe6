"""Longformer and LED: the sliding-window attention's overlapping chunks as ``unfold`` instead of ``as_strided``.

``LongformerSelfAttention._chunk`` and ``_sliding_chunks_matmul_attn_probs_value`` (and LED's copies,
``LEDEncoderSelfAttention``) build overlapping windows with ``as_strided`` over strides read from
``tensor.stride()``. Traced with a dynamic sequence those are symbolic strides: OpenVINO's frontend has no rule for
``aten.sym_stride.int``, torch.onnx's decomposition and ExecuTorch's lowering propagate a view that is not dense in
memory into a ``reshape`` they cannot infer ("propagate_real_tensors: we cannot infer a Fake kernel ... for
operator aten::reshape"). The same windows are ``unfold(1, size, step)`` with the last two axes swapped (upstream's
own ``onnx_export`` branch of ``_chunk`` for the query and key chunks), which every backend converts; the windows
and the diagonalized probabilities (a slice of a padded view, not dense either) are made contiguous before their
``einsum``, whose reshape the real-tensor propagation of LED's data-dependent trace cannot infer for a view that is
not dense. Drop it once upstream builds the windows without strides.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..registry import patch_attribute, register_for_backends, undo_all, uses_class

_CLASSES = (("transformers.models.longformer.modeling_longformer", "LongformerSelfAttention"),
            ("transformers.models.led.modeling_led", "LEDEncoderSelfAttention"))


def _chunk(hidden_states: torch.Tensor, window_overlap: int, onnx_export: bool = False) -> torch.Tensor:
    """Overlapping chunks of size ``2w`` and overlap ``w``: ``[BH, chunks, 2w, head_dim]``."""
    return hidden_states.unfold(dimension=1, size=window_overlap * 2, step=window_overlap).transpose(2, 3).contiguous()


def _probs_value(self: Any, attn_probs: torch.Tensor, value: torch.Tensor, window_overlap: int) -> torch.Tensor:
    """``_sliding_chunks_matmul_attn_probs_value`` with the value's chunks of ``3w`` (overlap ``w``) unfolded."""
    batch_size, seq_len, num_heads, head_dim = value.size()
    chunked_attn_probs = attn_probs.transpose(1, 2).reshape(
        batch_size * num_heads, torch.div(seq_len, window_overlap, rounding_mode="trunc"), window_overlap,
        2 * window_overlap + 1,
    )
    value = value.transpose(1, 2).reshape(batch_size * num_heads, seq_len, head_dim)
    padded_value = torch.nn.functional.pad(value, (0, 0, window_overlap, window_overlap), value=-1)
    chunked_value = padded_value.unfold(dimension=1, size=3 * window_overlap, step=window_overlap).transpose(2, 3)
    chunked_attn_probs = self._pad_and_diagonalize(chunked_attn_probs).contiguous()
    chunked_value = chunked_value.contiguous()
    context = torch.einsum("bcwd,bcdh->bcwh", (chunked_attn_probs, chunked_value))
    return context.view(batch_size, num_heads, seq_len, head_dim).transpose(1, 2)


def _applies(model: Any, inputs: dict) -> bool:
    return any(uses_class(model, module, name) for module, name in _CLASSES)


def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    undos = []
    for module, name in _CLASSES:
        cls = getattr(sys.modules.get(module), name, None)
        if cls is not None:
            undos.append(patch_attribute(cls, "_chunk", staticmethod(_chunk)))
            undos.append(patch_attribute(cls, "_sliding_chunks_matmul_attn_probs_value", _probs_value))
    return undo_all(undos)


_TARGET = "transformers models/longformer (and led) modeling: LongformerSelfAttention._chunk and " \
    "_sliding_chunks_matmul_attn_probs_value (as_strided over tensor.stride())"
register_for_backends("longformer-windows", _apply, _applies, [
    ("onnx", {"transformers": ">=5.0,<5.24"}, _TARGET,
     "torch.onnx's decomposition of the dynamic export cannot infer a reshape of the strided windows"),
    ("openvino", {"transformers": ">=5.0,<5.24"}, _TARGET,
     "OpenVINO's PyTorch frontend cannot convert aten.sym_stride.int (LED), or its decomposition cannot infer a "
     "reshape of the strided windows (Longformer)"),
    ("executorch", {"transformers": ">=5.0,<5.24"}, _TARGET,
     "ExecuTorch's lowering cannot infer a reshape of the strided windows"),
])
