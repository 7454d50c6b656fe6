"""ExecuTorch: trace a torchao-quantized embedding without its ``padding_idx``, so that quant fusion takes it.

A weight-only torchao embedding (``IntxWeightOnlyConfig`` on an ``nn.Embedding``) traces as
``torchao.dequantize_affine`` + ``aten.embedding``, which ``to_executorch``'s quant fusion pass
(``do_quant_fusion_and_const_prop``) rewrites into ``quantized_decomposed::embedding_byte`` / ``embedding_4bit``. Its
patterns (executorch/exir/passes/_quant_patterns_and_replacements.py, ``_get_embedding_ops_patterns_and_replacements_
torchao``) match ``embedding(weight, indices)`` only; a model whose embedding has a ``padding_idx`` (Llama's
``pad_token_id``) traces ``embedding(weight, indices, padding_idx)``, the dequantize stays, and ``to_executorch``
fails: "Missing out variants: {'torchao::dequantize_affine'}". ``padding_idx`` changes only the gradient, never the
forward, so the trace runs with it unset on the quantized embeddings (put back on exit).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import workaround

__all__ = ["quantized_padded_embeddings"]


def quantized_padded_embeddings(model: Any) -> list[Any]:
    """The ``nn.Embedding`` modules of ``model`` with a ``padding_idx`` whose weight torchao quantized."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return []
    return [
        m for m in model.modules()
        if isinstance(m, torch.nn.Embedding) and m.padding_idx is not None
        and type(m.weight).__module__.startswith("torchao")
    ]


@workaround(
    id="executorch-torchao-embedding-padding-idx",
    backend="executorch",
    target="torch.nn.Embedding.padding_idx (traced as aten.embedding's third argument)",
    breaks="a torchao weight-only embedding with a padding_idx (Llama's pad_token_id) escapes quant fusion and "
    "to_executorch fails: \"Missing out variants: {'torchao::dequantize_affine'}\"",
    upstream="executorch/exir/passes/_quant_patterns_and_replacements.py: the torchao embedding patterns match "
    "embedding(weight, indices) without padding_idx; no issue known",
    versions={"executorch": ">=1.0,<1.6"},
    applies=lambda model, inputs: bool(quantized_padded_embeddings(model)),
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    saved = [(m, m.padding_idx) for m in quantized_padded_embeddings(model)]
    for module, _ in saved:
        module.padding_idx = None

    def undo() -> None:
        for module, padding_idx in saved:
            module.padding_idx = padding_idx

    return undo
