"""Multimodal models: find the modality encoders, projector, language model and lm_head, and capture each one."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["is_multimodal", "MODALITIES"]

MODALITIES = ("image", "audio")


def _encoder_for(model: torch.nn.Module, modality: str) -> torch.nn.Module | None:
    get_encoder = getattr(model, "get_encoder", None)
    if not callable(get_encoder):
        return None
    try:
        encoder = get_encoder(modality=modality)
    except (TypeError, ValueError, AttributeError, NotImplementedError):
        return None
    return encoder if isinstance(encoder, torch.nn.Module) and encoder is not model else None


def is_multimodal(model: Any) -> bool:
    """True when the model has a modality encoder (image or audio) and a language model.

    A bare ``nn.Module`` (no ``get_encoder``/``get_decoder`` accessors) is not multimodal.
    """
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel) or getattr(model.config, "is_encoder_decoder", False):
        return False
    get_decoder = getattr(model, "get_decoder", None)
    if not callable(get_decoder):
        return False
    return any(_encoder_for(model, m) is not None for m in MODALITIES)
