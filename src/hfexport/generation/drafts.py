"""An exported model as the assistant of assisted decoding (``generate(assistant_model=exported)``).

transformers' ``AssistedCandidateGenerator`` drafts by calling ``assistant_model.generate`` once per block with the
assistant's cache from the previous block, cropped to the tokens the main model kept (``past_key_values.crop``,
``get_seq_length``), and reads back the drafted ``sequences``, their ``scores`` and the cache. :class:`ExportedAssistant`
answers those calls with an exported decoder-only model: it keeps one session (the export's cache, its positions and
static-cache slots) across the blocks of a ``generate`` call, feeds each block only the tokens the cache does not
hold yet (the multi-token decode graph in one call where the export has one), and drafts with the same
:func:`~hfexport.generation.loop.decode_loop` (processors, criteria, ``multinomial`` calls) as the export's own
``generate``. So transformers' generator runs unchanged: its number-of-drafts schedule, its confidence criterion and
the speculative sampling of the main loop see what an eager assistant gives them.
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import UnsupportedError
from .loop import Component, TextState, decode_loop, rollback_cache
from .plan import default_config, plan_generation

__all__ = ["ExportedAssistant", "is_exported", "refuse_stateful"]


def is_exported(model: Any) -> bool:
    """Whether ``model`` is an :class:`~hfexport.ExportedModel` (by what it has: the generation package sits below
    the module that defines it)."""
    return hasattr(model, "components") and hasattr(model, "runner") and hasattr(model, "export_format")


def refuse_stateful(exported: Any, which: str, fix: str) -> None:
    """Assisted decoding rolls a cache back past the rejected drafts: refuse an export whose cache lives inside the
    runtime (stateful), out of reach."""
    for name in ("prefill", "decode"):
        if getattr(exported.runner(name), "stateful", False):
            raise UnsupportedError(
                f"assisted decoding rolls the cache back past rejected drafts, and {which} keeps its cache inside the "
                f"runtime (stateful), out of reach: {fix}")


class _DraftCache:
    """What the candidate generator sees of the assistant's cache: its length, and ``crop`` to forget drafts."""

    def __init__(self, assistant: ExportedAssistant):
        self._assistant = assistant

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self._assistant.cached

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:  # as DynamicLayer.crop refuses it
            raise ValueError(f"crop takes a negative number of tokens to remove, got {tokens_to_remove}")
        self._assistant.cached = max(0, self._assistant.cached + tokens_to_remove)


class ExportedAssistant:
    """An exported decoder-only model, shaped as the assistant model ``AssistedCandidateGenerator`` drives.

    Args:
        exported: The assistant's ``ExportedModel`` (``export_for_generation``: prefill and decode).
        max_length: The main call's ``max_length`` (no draft goes past it; a static cache must hold it).
        device: Where the main loop keeps its tensors.
    """

    def __init__(self, exported: Any, max_length: int, device: torch.device):
        from transformers import GenerationConfig

        names = set(exported.components)
        if not {"prefill", "decode"} <= names or "encoder" in names or "language_model" in names:
            raise UnsupportedError(
                f"assistant_model= takes a decoder-only export of export_for_generation (prefill + decode); this "
                f"one has {sorted(names)}")
        refuse_stateful(exported, "the assistant export", "export the assistant with stateful=False")
        self.exported = exported
        self.config = default_config(exported)
        if exported.generation_config is None:  # the generator reads (and eager writes back) its draft settings
            exported.generation_config = GenerationConfig()
        self.generation_config = exported.generation_config
        self.device = device
        self.max_length = int(max_length)
        self.cached = 0  # positions the assistant's cache holds (the candidate generator crops it)
        self._prefill, self._decode = Component(exported, "prefill"), Component(exported, "decode")
        spec = self._decode.metadata.input_spec("input_ids")
        self._block = spec is not None and len(spec.shape) >= 2 and not spec.shape[-1] == 1  # multi-token decode
        self._cache: Any = None
        self._text: TextState | None = None

    def generate(self, input_ids: torch.Tensor, past_key_values: Any = None, attention_mask: Any = None,
                 use_cache: bool = True, **kwargs: Any) -> Any:
        """Draft after ``input_ids`` as the eager assistant's ``generate`` does (``kwargs``: the candidate
        generator's ``generation_config``, ``logits_processor``, ``min_new_tokens``, ``max_new_tokens``);
        returns a ``GenerateDecoderOnlyOutput`` with the scores and this session's cache."""
        if attention_mask is not None and not bool(attention_mask.bool().all()):
            raise UnsupportedError("assisted decoding takes one unpadded prompt")
        if past_key_values is None or self._cache is None:
            self._start(input_ids)
        plan = plan_generation(self.exported, dict(kwargs, input_ids=input_ids), self.device)
        logits = self._feed(input_ids)
        text = self._text

        def step(token: torch.Tensor) -> torch.Tensor:
            position = text.advance()
            out = self._decode.runner(input_ids=token[:, None], **text.kwargs(self._decode, position, 1, self._cache))
            self._cache = getattr(out, self._decode.cache_key)
            self.cached = position + 1
            return out.logits

        output = decode_loop(plan, input_ids, logits, step)
        output.past_key_values = _DraftCache(self)
        return output

    def _start(self, input_ids: torch.Tensor) -> None:
        if input_ids.shape[0] != 1:
            raise UnsupportedError("assisted generate is only supported for batch_size = 1 (as in model.generate)")
        prompt = input_ids.shape[-1]
        window = getattr(self.exported.config, "sliding_window", None) if self.exported.config is not None else None
        capacity = self._decode.cache_capacity()
        if capacity is not None and self.max_length > capacity:
            raise UnsupportedError(
                f"the assistant export's static cache holds {capacity} positions and this call generates up to "
                f"max_length={self.max_length}: re-export the assistant with max_cache_len >= {self.max_length}, or "
                "with a dynamic cache")
        mask = torch.ones_like(input_ids)
        self._text = TextState(mask, max(self.max_length - prompt, 1), capacity, window)
        self._cache = self._prefill.initial_cache(1, input_ids.device)
        self.cached = 0

    def _feed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the tokens the cache does not hold yet; returns the logits after the last of them."""
        text, start = self._text, self.cached
        if start >= input_ids.shape[-1]:  # a crop that kept every token: the last one's logits are gone, rerun it
            start = input_ids.shape[-1] - 1
        rollback_cache(self._cache, start)
        text.rewind(start)
        if start == 0:  # (a fresh cache: the prefill graph takes the one it was traced with)
            self._cache = self._prefill.initial_cache(1, input_ids.device)
            calls = [(self._prefill, input_ids)]
        elif self._block:
            calls = [(self._decode, input_ids[:, start:])]
        else:
            calls = [(self._decode, input_ids[:, i: i + 1]) for i in range(start, input_ids.shape[-1])]
        for component, block in calls:
            q = block.shape[-1]
            if text.valid is not None:
                text.valid[:, text.length: text.length + q] = True
            out = component.runner(input_ids=block, **text.kwargs(component, text.length, q, self._cache))
            self._cache = getattr(out, component.cache_key)
            text.length += q
        self.cached = text.length
        return out.logits
