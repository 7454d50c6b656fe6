"""A multimodal model's own ``get_image_features`` as one exported part, where hfexport has no glue for its parts.

:mod:`.multimodal` splits an image-text model into its vision tower and projector and replays, in Python, what the
model does between them (:mod:`.glue`: the feature layer, the CLS token, a pixel shuffle). A model whose
``get_image_features`` does more than the glue knows (two towers, DeepSeek-VL hybrid's low- and high-resolution
ones into one aligner; Ovis 2's visual tokenizer and its vocabulary table; Idefics 2's perceiver over a patch mask)
is captured instead as :class:`ImageFeatures`: a module whose forward is the model's ``get_image_features`` on the
image inputs, returning the features the model scatters over its image tokens (``[image tokens, hidden]``). The
parts it owns are the model's (its base model shallow-copied without the language model, so the export holds the
vision weights only). :func:`image_features_part` builds it and checks, as the glue's capture does, that scattering
its output reproduces the model's own ``inputs_embeds``; where the model adds its features to the placeholder token's
embedding instead of replacing it (Molmo 2), the part adds that embedding row itself, so that generation replaces
the placeholders as for any other model.

An audio-text model whose type has no glue in :data:`.audio.AUDIO_GLUE` (Nemotron 3.5 Transcribe, Music Flamingo)
is captured the same way with its ``get_audio_features``: :class:`AudioFeatures`, :func:`audio_features_part`.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import UnsupportedError
from .glue import image_token_id, merge_image_features, placeholder_token_id

__all__ = ["AudioFeatures", "ImageFeatures", "audio_features_part", "flat_features", "image_features_part"]


def flat_features(out: Any) -> torch.Tensor:
    """``get_image_features``' result as ``[features, hidden]``: its ``pooler_output`` (transformers 5's
    convention: the features the forward merges), one tensor or one per image, else the tensor itself."""
    features = getattr(out, "pooler_output", None)
    if features is None:
        features = out[0] if isinstance(out, tuple) and not isinstance(out[0], torch.Tensor | list) else out
    if isinstance(features, list | tuple):
        features = torch.cat([f.reshape(-1, f.shape[-1]) for f in features])
    if not isinstance(features, torch.Tensor):
        raise UnsupportedError(f"get_image_features returned {type(out).__name__} without image features")
    return features.reshape(-1, features.shape[-1])


def _concatenated(features: Any) -> torch.Tensor:
    """One deepstack entry (a tensor, or one per sample) as ``[image tokens, hidden]``."""
    if isinstance(features, list | tuple):
        features = torch.cat([f.reshape(-1, f.shape[-1]) for f in features])
    return features.reshape(-1, features.shape[-1])


class ImageFeatures(torch.nn.Module):
    """``owner.get_image_features(**image inputs)`` flattened to ``[image tokens, hidden]``; followed by its
    deepstack features (one per tapped vision layer, each ``[image tokens, hidden]``) where it returns them, which
    the language model adds at its early layers (Granite Docling, as Qwen3-VL)."""

    method = "get_image_features"

    def __init__(self, owner: torch.nn.Module, placeholder: torch.Tensor | None = None):
        super().__init__()
        self.owner = owner
        # a model that adds its features to the placeholder token's embedding instead of replacing it (Molmo 2):
        # that embedding row, added here, so that replacing the placeholders with the output gives the same
        self.register_buffer("placeholder", placeholder, persistent=False)

    def forward(self, **inputs: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        out = getattr(self.owner, self.method)(**inputs)
        features = flat_features(out)
        if self.placeholder is not None:
            features = features + self.placeholder
        deepstack = getattr(out, "deepstack_features", None)
        if not deepstack:
            return features
        return (features, *(_concatenated(d) for d in deepstack))


class AudioFeatures(ImageFeatures):
    """``owner.get_audio_features(**audio inputs)`` flattened to ``[audio tokens, hidden]`` (its ``pooler_output``:
    the features of every clip's real frames, clip after clip, which the forward scatters over the audio tokens)."""

    method = "get_audio_features"


def _owner(model: torch.nn.Module, method: str = ImageFeatures.method) -> torch.nn.Module | None:
    """The module whose ``method`` (``get_image_features``...) the model's forward calls (its base model, else
    itself), shallow-copied without its language model."""
    base = getattr(model, "model", None)
    owner = base if callable(getattr(base, method, None)) else model
    if not callable(getattr(owner, method, None)):
        return None
    get_decoder = getattr(owner, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    shallow = copy.copy(owner)
    shallow._modules = {name: module for name, module in owner._modules.items()
                        if module is not decoder and name not in ("language_model", "lm_head")}
    return shallow


def _part(kind: type[ImageFeatures], modality: str, main: str, model: torch.nn.Module, call: Mapping[str, Any],
          embed: torch.nn.Module, expected: torch.Tensor | None) -> tuple[ImageFeatures, dict[str, Any]] | None:
    """``(kind(owner), its kwargs)`` where scattering its features over ``modality``'s placeholder tokens of the
    prefill ``call`` gives ``expected`` (the language model's recorded ``inputs_embeds``); else ``None``."""
    if expected is None or call.get("input_ids") is None:
        return None
    owner = _owner(model, kind.method)
    if owner is None:
        return None
    params = inspect.signature(getattr(owner, kind.method)).parameters
    kwargs = {k: v for k, v in call.items() if k in params and isinstance(v, torch.Tensor)}
    if main not in kwargs:
        return None
    for added in (False, True):  # the features in place of the placeholders' embeddings, else added to them
        try:
            token = placeholder_token_id(model.config, modality)
            with torch.no_grad():
                part = kind(owner, embed(torch.tensor(token)).detach().clone() if added else None).eval()
                features = part(**kwargs)
                features = features[0] if isinstance(features, tuple) else features
                merged = merge_image_features(call["input_ids"], embed(call["input_ids"]), features, token, modality)
        except Exception:  # noqa: BLE001 - not a model whose features this reproduces
            return None
        if merged.shape == expected.shape and torch.allclose(merged, expected, rtol=1e-5, atol=1e-6):
            return part, kwargs
    return None


def image_features_part(model: torch.nn.Module, call: Mapping[str, Any], embed: torch.nn.Module,
                        expected: torch.Tensor | None) -> tuple[ImageFeatures, dict[str, Any]] | None:
    """``(ImageFeatures, its kwargs)`` for the prefill ``call``, where scattering its features over the image
    tokens gives ``expected`` (the language model's recorded ``inputs_embeds``); else ``None``."""
    if call.get("pixel_values_videos") is not None:
        return None
    return _part(ImageFeatures, "image", "pixel_values", model, call, embed, expected)


def audio_features_part(model: torch.nn.Module, call: Mapping[str, Any], embed: torch.nn.Module,
                        expected: torch.Tensor | None) -> tuple[AudioFeatures, dict[str, Any]] | None:
    """``(AudioFeatures, its kwargs)`` for a prefill ``call`` with audio only (``input_features``), where
    scattering its features over the audio tokens gives ``expected``; else ``None``."""
    if any(call.get(k) is not None for k in ("pixel_values", "pixel_values_videos")):
        return None
    return _part(AudioFeatures, "audio", "input_features", model, call, embed, expected)
