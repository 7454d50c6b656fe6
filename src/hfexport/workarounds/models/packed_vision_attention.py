"""Packed vision towers (Qwen2-VL, Qwen2.5-VL and the 40-odd towers written after them): one masked attention over all
images instead of a split per image.

Their vision attention runs, unless flash attention is configured, ``torch.split(q, (cu_seqlens[1:] -
cu_seqlens[:-1]).tolist())`` and one attention per image: the sizes are data (unbacked), and the attention then
guards on them (``GuardOnDataDependentSymNode``). With flash attention configured the same forward makes one varlen
call with ``cu_seq_lens_q=cu_seqlens`` instead. During the trace this workaround has such a module take that branch,
with an attention function of ours behind the name: one call of the model's configured attention (SDPA, eager) over
all patches with a "same image" mask built from ``cu_seqlens`` (each patch attends to its own image only: the split's
result, in one graph for any number of images of any size), additive, as an eager attention adds it to its scores.

Drop it once transformers' vision attention traces with a symbolic image count.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from typing import Any

import torch

from ..registry import workaround

_NAME = "flash_hfexport_packed"  # (the forward takes its varlen branch where the name says "flash")


@functools.cache
def _is_packed(cls: type) -> bool:
    """A vision attention whose forward splits the packed patches per image unless flash attention is configured."""
    forward = getattr(cls, "forward", None)
    if forward is None or "cu_seqlens" not in inspect.signature(forward).parameters:
        return False
    try:
        source = inspect.getsource(forward)
    except (OSError, TypeError):
        return False
    return ".tolist()" in source and "cu_seq_lens_q=cu_seqlens" in source and "is_flash_attention_requested" in source


def _segments(cu_seqlens: torch.Tensor, length: int, device: torch.device) -> torch.Tensor:
    """Each patch's image (plus one): the count of image bounds at or before it. A mark per bound and a running sum,
    neither a slice of ``cu_seqlens`` nor a broadcast against it (their lengths, the image count, would be guarded)."""
    bounds = cu_seqlens.long().to(device)
    marks = torch.zeros(length + 1, dtype=torch.long, device=device)
    return marks.index_add(0, bounds, torch.ones_like(bounds)).cumsum(0)[:length]


def _packed_attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: Any,
                      cu_seq_lens_q: torch.Tensor, *, implementation: str, **kwargs: Any) -> Any:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    for name in ("cu_seq_lens_k", "max_length_q", "max_length_k"):
        kwargs.pop(name, None)
    segment = _segments(cu_seq_lens_q, query.shape[-2], query.device)
    # additive (0 within an image, the dtype's minimum across): SDPA takes it as a boolean one, and an eager
    # attention adds its mask to the scores (a boolean one added 1 within an image and masked nothing: Inkling 2)
    same = (segment[:, None] == segment[None, :])[None, None]
    mask = torch.zeros(same.shape, dtype=query.dtype, device=query.device).masked_fill(~same,
                                                                                       torch.finfo(query.dtype).min)
    eager = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    attention = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager)
    return attention(module, query, key, value, attention_mask=mask, **kwargs)


def _through_varlen(forward: Callable) -> Callable:
    @functools.wraps(forward)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        from transformers.modeling_utils import AttentionInterface

        config = self.config
        implementation = config._attn_implementation_internal
        AttentionInterface.register(_NAME, functools.partial(_packed_attention, implementation=implementation))
        config._attn_implementation_internal = _NAME
        if "max_seqlen" not in kwargs or kwargs["max_seqlen"] is None:  # (else the varlen branch slices cu_seqlens
            kwargs["max_seqlen"] = 0  # for it, guarding on two images at least; our attention needs none)
        try:
            return forward(self, *args, **kwargs)
        finally:
            config._attn_implementation_internal = implementation
    return wrapper


def _packed_classes(model: Any) -> list[type]:
    if not hasattr(model, "modules"):
        return []
    return list(dict.fromkeys(type(m) for m in model.modules() if _is_packed(type(m))
                              and "flash" not in str(getattr(m.config, "_attn_implementation", ""))))


def _applies(model: Any, inputs: dict) -> bool:
    return any("grid" in k or k == "cu_seqlens" for k in inputs) and bool(_packed_classes(model))


@workaround(
    id="packed-vision-attention",
    backend="all",
    target="transformers.models.*.modeling_*.*VisionAttention.forward (packed towers after Qwen2.5-VL's)",
    breaks="the per-image split `torch.split(..., (cu_seqlens[1:] - cu_seqlens[:-1]).tolist())` makes unbacked "
    "sizes the attention then guards on (GuardOnDataDependentSymNode)",
    upstream=None,
    versions={"transformers": ">=5.0,<5.24"},
    applies=_applies,
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    from transformers.modeling_utils import AttentionInterface

    owners = dict.fromkeys(next(c for c in cls.__mro__ if "forward" in c.__dict__) for cls in _packed_classes(model))
    saved = [(owner, owner.__dict__["forward"]) for owner in owners]  # (the class that defines it: a subclass's too)
    for cls, forward in saved:
        cls.forward = _through_varlen(forward)

    def undo() -> None:
        for cls, forward in saved:
            cls.forward = forward
        AttentionInterface._global_mapping.pop(_NAME, None)
    return undo


@workaround(
    id="packed-vision-one-image",
    backend="all",
    target="torch.fx.experimental._config.backed_size_oblivious (during a packed tower's trace)",
    breaks="a tower traced on two images broadcasts its per-image lengths (cu_seqlens[1:] - cu_seqlens[:-1], GLM-4V's "
    "position-embedding interpolation) against the patches, and the trace guards that there are two images at "
    "least (cu_seqlens.size()[0] >= 3): one image, the common prompt, is refused",
    upstream="torch.export's 0/1 specialization of backed sizes; no issue known",
    versions={"torch": ">=2.9,<2.14"},
    applies=_applies,
)
def _apply_oblivious(model: Any, inputs: dict) -> Callable[[], None]:
    """Trace the tower with size-oblivious backed sizes: a length that may be 1 is not guarded to be 2 or more
    (broadcasting a size-1 length gives the same result)."""
    import torch.fx.experimental._config as fx_config

    before = fx_config.backed_size_oblivious
    fx_config.backed_size_oblivious = True

    def undo() -> None:
        fx_config.backed_size_oblivious = before
    return undo
