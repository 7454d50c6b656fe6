"""ONNX: export grouped-query SDPA as one ``Attention`` over the un-repeated K/V heads.

The same transformers decision as :mod:`.dynamo_sdpa_gqa` (``use_gqa_in_sdpa`` says no on CPU with a mask, so
``repeat_kv`` copies every layer's K/V to all query heads), seen from the ONNX side: the copy becomes an
``Unsqueeze``/``Expand``/``Reshape`` of the whole cache in every layer at every decode step. The ONNX ``Attention``
op (opset >= 23) takes fewer K/V heads than query heads, so tracing with ``enable_gqa=True`` gives a graph that
reads the cache as it is. Only from opset 23: below it, torchlib lowers a GQA SDPA with the same repeat.
Drop it once transformers enables GQA for traced CPU graphs.
"""

from __future__ import annotations

from typing import Any

from .dynamo_sdpa_gqa import _apply, _applies
from .registry import Workaround, register_workaround

__all__: list[str] = []


def _applies_to_onnx(model: Any, inputs: dict) -> bool:
    from ..backends.onnx.convert import current_opset

    return current_opset() >= 23 and _applies(model, inputs)


register_workaround(
    Workaround(
        id="onnx-sdpa-gqa",
        backend="onnx",
        target="transformers.integrations.sdpa_attention.use_gqa_in_sdpa",
        breaks="repeat_kv copies every layer's whole K/V cache to all query heads on each decode step",
        upstream=None,
        versions={"transformers": ">=5.0,<5.24", "torch": ">=2.5"},
        apply=_apply,
        applies=_applies_to_onnx,
    )
)
