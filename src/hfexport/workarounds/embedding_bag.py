"""OpenVINO, ExecuTorch: an ``embedding_bag`` of fixed-size bags (a 2-D input) traced as a gather and a reduction.

``F.embedding_bag`` converts to OpenVINO's ``EmbeddingBagOffsets``, and the CPU plugin cannot compile that node where
the bag input's length is dynamic: ``compile_model`` stops with "to_shape was called on a dynamic shape" (openvino
2026.3.1; found by compiling the converted model cut after each node). Kimi-K2.5's vision tower resamples its
position table to each image's grid with one ``embedding_bag`` over ``[patches, 16]`` interpolation indices and
weights, whose patch count comes from the image sizes. A 2-D input is a batch of bags of one size, so while tracing
for OpenVINO ``F.embedding_bag`` of a 2-D input computes ``weight[input]`` (weighted by ``per_sample_weights``)
reduced over each bag (sum, mean or max, as ``mode`` says); other calls (1-D input with offsets, ``max_norm``,
``padding_idx``) go to torch's own. ExecuTorch's runtime has no kernel for ``aten._embedding_bag`` (the method
fails to load, error 0x14): the same rewrite there. Drop each once the plugin compiles a dynamic
``EmbeddingBagOffsets`` / the runtime has the kernel.
"""

from __future__ import annotations

from typing import Any

from .registry import modeling_code_names, patch_attribute, register_for_backends

__all__ = ["bags_as_gather"]


def bags_as_gather(original: Any) -> Any:
    """``F.embedding_bag`` that computes fixed-size bags (a 2-D ``input``) as a gather and a reduction, and passes
    every other call to ``original``."""

    def embedding_bag(input: Any, weight: Any, offsets: Any = None, max_norm: Any = None, norm_type: float = 2.0,
                      scale_grad_by_freq: bool = False, mode: str = "mean", sparse: bool = False,
                      per_sample_weights: Any = None, include_last_offset: bool = False,
                      padding_idx: Any = None) -> Any:
        if input.dim() != 2 or offsets is not None or max_norm is not None or padding_idx is not None:
            return original(input, weight, offsets, max_norm, norm_type, scale_grad_by_freq, mode, sparse,
                            per_sample_weights, include_last_offset, padding_idx)
        rows = weight[input]
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.unsqueeze(-1).to(rows.dtype)
        if mode == "sum":
            return rows.sum(1)
        return rows.mean(1) if mode == "mean" else rows.amax(1)

    return embedding_bag


def _apply(model: Any, inputs: dict):
    import torch.nn.functional as F

    return patch_attribute(F, "embedding_bag", bags_as_gather(F.embedding_bag))


register_for_backends("embedding-bag", _apply, lambda model, inputs: modeling_code_names(model, "embedding_bag"), (
    ("openvino", {"openvino": ">=2024.0,<2027"}, "OpenVINO CPU plugin: EmbeddingBagOffsets with a dynamic bag input",
     "compile_model fails with 'to_shape was called on a dynamic shape' for an embedding_bag whose input length "
     "depends on the inputs (Kimi-K2.5's vision position table, resampled per image)"),
    ("executorch", {"executorch": ">=0.6,<1.6"}, "ExecuTorch portable kernels: no aten._embedding_bag",
     "the program fails to load: 'Failed to load method forward, error: 0x:14' (an operator without a kernel; "
     "Kimi-K2.5's vision position table)"),
))
