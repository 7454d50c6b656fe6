"""Dynamo: let SDPA read grouped K/V heads directly instead of copying the whole cache every step.

transformers' SDPA path decides with ``use_gqa_in_sdpa`` whether to pass ``enable_gqa=True``; on CPU with a mask
it says no, and under tracing ``repeat_kv`` then materialises every layer's K/V expanded to all query heads —
a copy of the whole cache per layer per decode step (53% of a static-cache decode step of SmolLM2 here, the
decode running at 0.4–0.7x eager). torch >= 2.5 SDPA takes grouped heads with a mask on CPU, so during a Dynamo
trace we answer yes. Only for Dynamo: the other backends lower SDPA themselves. Drop it once transformers
enables GQA for traced CPU graphs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .registry import patch_attribute, workaround

_MODULE = "transformers.integrations.sdpa_attention"


def _applies(model: Any, inputs: dict) -> bool:
    module = sys.modules.get(_MODULE)
    config = getattr(model, "config", None)
    if module is None or config is None:
        return False
    get_text = getattr(config, "get_text_config", None)
    text = get_text() if callable(get_text) else config
    heads, kv_heads = _read(text, "num_attention_heads"), _read(text, "num_key_value_heads")
    impl = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)
    grouped = _PER_LAYER in (heads, kv_heads) or (isinstance(heads, int) and isinstance(kv_heads, int)
                                                   and kv_heads < heads)
    return impl == "sdpa" and grouped


_PER_LAYER = object()


def _read(config: Any, name: str) -> Any:
    """``config.<name>``, or :data:`_PER_LAYER` where a heterogeneous config refuses the global read because the
    value varies by layer (transformers' ``AmbiguousGlobalPerLayerAttributeError``, EmbeddingGemma 2's heads): some
    layer may then group its key/value heads, and answering yes for the others is still right."""
    try:
        return getattr(config, name, None)
    except RuntimeError as e:  # (by name: its module is new in transformers 5.2x)
        if type(e).__name__ == "AmbiguousGlobalPerLayerAttributeError":
            return _PER_LAYER
        raise


@workaround(
    id="dynamo-sdpa-gqa",
    backend="dynamo",
    target=f"{_MODULE}.use_gqa_in_sdpa",
    breaks="repeat_kv copies every layer's whole K/V cache to all query heads on each decode step (slower than eager)",
    upstream=None,
    versions={"transformers": ">=5.0,<5.24", "torch": ">=2.5"},
    applies=_applies,
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    module = sys.modules[_MODULE]
    original = module.use_gqa_in_sdpa

    def use_gqa(attention_mask: Any, key: Any, value: Any) -> bool:
        return key.device.type == "cpu" or original(attention_mask, key, value)

    return patch_attribute(module, "use_gqa_in_sdpa", use_gqa)
