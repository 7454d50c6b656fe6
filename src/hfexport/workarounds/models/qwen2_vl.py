"""Qwen2-VL: trace the vision tower's packed attention without data-dependent splits.

transformers splits the packed patches per image with ``torch.split(..., (cu_seqlens[1:] - cu_seqlens[:-1]).tolist())``
and ``sdpa_attention_forward`` then guards on the unbacked sizes (``GuardOnDataDependentSymNode``). During the trace we
run one attention over all patches with a "same image" mask instead: the same result, and one graph for any number of
images of any size. Drop it once the vision attention traces with a symbolic image count.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..registry import Workaround, patch_attribute, register_workaround

_QWEN2_VL = "transformers.models.qwen2_vl.modeling_qwen2_vl"


def _block_diagonal_vision_attention(self: Any, hidden_states: torch.Tensor, cu_seqlens: torch.Tensor,
                                     position_embeddings: Any = None, max_seqlen: Any = None, **kwargs: Any) -> Any:
    """``VisionAttention.forward`` with one masked attention over all images instead of a split per image.

    Same result (each patch attends to its own image only), without ``cu_seqlens.tolist()``: the mask is "same
    image", so one graph takes any number of images of any sizes.
    """
    module = sys.modules[_QWEN2_VL]
    seq_length = hidden_states.shape[0]
    qkv = self.qkv(hidden_states).reshape(seq_length, 3, self.num_heads, -1).permute(1, 0, 2, 3)
    query, key, value = qkv.unbind(0)
    cos, sin = position_embeddings
    query, key = module.apply_rotary_pos_emb_vision(query, key, cos, sin)
    query, key, value = (t.transpose(0, 1).unsqueeze(0) for t in (query, key, value))
    # a patch's image (plus one) = how many image starts/ends lie at or before it: mark each boundary, then a
    # running sum. Neither a broadcast against cu_seqlens nor a slice of it: torch.export would guard on their
    # lengths (the image count) being at least two.
    bounds = cu_seqlens.long()
    marks = torch.zeros(seq_length + 1, dtype=torch.long, device=hidden_states.device)
    segment = marks.index_add(0, bounds, torch.ones_like(bounds)).cumsum(0)[:seq_length]
    mask = (segment[:, None] == segment[None, :])[None, None]
    attention = module.ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                             module.eager_attention_forward)
    output = attention(self, query, key, value, attention_mask=mask, scaling=self.scaling, dropout=0.0,
                       is_causal=False, **kwargs)[0]
    return self.proj(output.reshape(seq_length, -1).contiguous())


def _qwen2_vl_vision_applies(model: Any, inputs: dict) -> bool:
    module = sys.modules.get(_QWEN2_VL)
    if module is None or not hasattr(model, "modules") or not {"grid_thw", "image_grid_thw"} & set(inputs):
        return False  # e.g. the decode graph: the whole model, but no image goes through the vision tower
    return any(type(m) is module.VisionAttention and "flash" not in str(m.config._attn_implementation)
               for m in model.modules())


def _qwen2_vl_vision_apply(model: Any, inputs: dict) -> Callable[[], None]:
    return patch_attribute(sys.modules[_QWEN2_VL].VisionAttention, "forward", _block_diagonal_vision_attention)


register_workaround(
    Workaround(
        id="qwen2-vl-packed-vision-attention",
        backend="all",
        target=f"{_QWEN2_VL}.VisionAttention.forward",
        breaks="the per-image split `torch.split(..., (cu_seqlens[1:] - cu_seqlens[:-1]).tolist())` makes unbacked "
        "sizes, and sdpa_attention_forward's `q_length > 1` then guards on them (GuardOnDataDependentSymNode)",
        upstream=None,
        versions={"transformers": ">=5.0,<5.24"},
        apply=_qwen2_vl_vision_apply,
        applies=_qwen2_vl_vision_applies,
    )
)
