"""Image-text and audio-text prompts for the matrix: one image (or clip) per row and as many placeholder tokens as
the model's tower makes features of it, wrapped in the family's start and end tokens where it has them, right after
each row's left padding (:func:`with_image`, :func:`with_audio`); the layouts a tower may want its media in come from
:mod:`.media`."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from itertools import chain
from typing import Any

import torch

from .media import GRID_KEYS, aligned_features, config_value, feature_layouts, feature_width, grid_candidates, \
    packed_candidates, patch_candidates, runs, sample_features, sample_pixels
from .overrides import IMAGE_PROCESSOR_KWARGS

__all__ = ["with_image", "with_audio"]


def _feature_count(features: Any) -> int:
    if isinstance(features, torch.Tensor):
        return features.numel()
    for name in ("pooler_output", "last_hidden_state"):  # (Llama 4's tower leaves its pooler output None)
        if isinstance(getattr(features, name, None), (torch.Tensor, list, tuple)):
            return _feature_count(getattr(features, name))
    if isinstance(features, (list, tuple)):
        return sum(_feature_count(f) for f in features if isinstance(f, (torch.Tensor, list, tuple)))
    raise TypeError(f"image features of type {type(features).__name__}")


def _crop_count(config: Any, size: tuple[int, int]) -> int | None:
    """How many crops an any-resolution tower (LLaVA-NeXT's ``image_grid_pinpoints``) cuts an image of ``size``
    into, its base crop included, by transformers' own count; ``None`` without pinpoints."""
    pinpoints, side = getattr(config, "image_grid_pinpoints", None), config_value(config, "image_size")
    if not isinstance(pinpoints, list) or not isinstance(side, int):
        return None
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    return image_size_to_num_patches(tuple(size), pinpoints, side)


def _image_kwargs(model: Any, features: Any, gen: torch.Generator, batch: int) -> Iterator[dict[str, Any]]:
    """What ``get_image_features`` may take for one image per row: pixels ``[B, C, H, W]``, then one image per row
    ``[B, 1, C, H, W]`` (Idefics-like towers), with each image's size and its crops where it takes ``image_sizes``
    (LLaVA-NeXT-like: a base crop plus a grid), then the images' patches flattened ``[B * patches, C * P * P]``;
    flattened patches and their ``image_grid_thw`` where it takes a grid
    (Qwen-VL-like towers)."""
    config = model.config
    params = inspect.signature(features).parameters
    recipe = IMAGE_PROCESSOR_KWARGS.get(getattr(config, "model_type", None))
    if recipe is not None:  # a layout only the family's own image processor writes
        yield from _processed_images(config.model_type, recipe, gen, batch)
        return
    if {*params} <= {"args", "kwargs"} and hasattr(model.base_model, "get_image_features"):  # a head class's
        params = inspect.signature(model.base_model.get_image_features).parameters  # pass-through: its base's
    if "target_sizes" in params:  # MiniCPM-V-like: patches packed in one row
        yield from packed_candidates(getattr(config, "vision_config", None) or config, gen, batch)
        return
    if any(k in params for k in GRID_KEYS):  # (with what the forward takes beside the grid: a get_image_features
        # that passes its kwargs on may need them, VideoLLaMA 3's image_merge_sizes)
        both = {**inspect.signature(model.forward).parameters, **params}
        yield from grid_candidates(getattr(config, "vision_config", None) or config, gen, batch, both)
        return
    images = sample_pixels(model, gen, batch)
    if "spatial_shapes" in params:  # a NaFlex tower (LFM2-VL's SigLIP 2): one image per row, cut into patches
        yield from patch_candidates(getattr(config, "vision_config", None) or config, gen, batch, images.shape[-1],
                                    params)
        return
    extra = {}
    if "image_sizes" in params:
        extra["image_sizes"] = torch.tensor([list(images.shape[-2:])] * batch)
    for name in params:  # a second tower's own images (DeepSeek-VL hybrid's high_res_pixel_values), at its size
        prefix = name[: -len("_pixel_values")] if name.endswith("_pixel_values") else None
        side = config_value(getattr(config, f"{prefix}_vision_config", None), "image_size") if prefix else None
        if isinstance(side, int):
            extra[name] = torch.randn(batch, images.shape[1], side, side, generator=gen)
    layouts = [images, images.unsqueeze(1)]
    crops = (2, 3, 5, _crop_count(config, images.shape[-2:])) if "image_sizes" in params else ()
    layouts += [images.unsqueeze(1).repeat(1, n, 1, 1, 1) for n in dict.fromkeys(crops) if n]
    # frames channels last, one or two (Inkling's [B, T, H, W, C], folded in time by 2)
    layouts += [images.permute(0, 2, 3, 1).unsqueeze(1).repeat(1, t, 1, 1, 1) for t in (1, 2)]
    for pixels in layouts:
        yield {"pixel_values": pixels, **extra}
        if "pixel_attention_mask" in params:  # then with its mask, where the tower needs one (Idefics3-like)
            mask = torch.ones(*pixels.shape[:-3], *pixels.shape[-2:], dtype=torch.long)
            yield {"pixel_values": pixels, **extra, "pixel_attention_mask": mask}
            if pixels.dim() == 5:  # (or a mask of the real tiles, Granite Docling's)
                tiles = torch.ones(*pixels.shape[:2], dtype=torch.bool)
                yield {"pixel_values": pixels, **extra, "pixel_attention_mask": tiles}
    patch, (b, c, h, w) = config_value(config, "patch_size"), images.shape
    if isinstance(patch, int) and h % patch == 0 and w % patch == 0:  # every image's patches flattened, one per row
        yield {"pixel_values": images.reshape(b, c, h // patch, patch, w // patch, patch)  # (NeoMME's)
               .permute(0, 2, 4, 1, 3, 5).reshape(-1, c * patch * patch)}


def _processed_images(model_type: str, recipe: dict[str, Any], gen: torch.Generator,
                      batch: int) -> Iterator[dict[str, Any]]:
    """What the family's image processor (transformers' own class for ``model_type``, built from ``recipe`` without
    files) makes of one random 48-pixel RGB image per row."""
    from transformers.models.auto.image_processing_auto import get_image_processor_class_from_name, \
        IMAGE_PROCESSOR_MAPPING_NAMES

    names = IMAGE_PROCESSOR_MAPPING_NAMES.get(model_type) or {}
    name = names.get("torchvision") or names.get("pil") if isinstance(names, dict) else names
    cls = get_image_processor_class_from_name(name) if name else None
    if cls is None:
        return
    images = [torch.randint(0, 256, (3, 48, 48), dtype=torch.uint8, generator=gen) for _ in range(batch)]
    yield dict(cls(**recipe)(images, return_tensors="pt"))


def _for_features(config: Any, extra: dict[str, Any], wanted: Any) -> dict[str, Any]:
    """``extra`` as ``get_image_features`` takes it: an image processor's output (:data:`IMAGE_PROCESSOR_KWARGS`)
    only by the names it declares (Molmo 2's crop counts are the forward's, and its ``**kwargs`` reach the tower);
    the layouts built here as they are (a pass-through ``**kwargs`` may need them: VideoLLaMA 3's merge sizes)."""
    if getattr(config, "model_type", None) not in IMAGE_PROCESSOR_KWARGS:
        return extra
    return {k: v for k, v in extra.items() if k in wanted}


_IMAGE_BRACKETS = (("vision_start_token_id", "vision_end_token_id"), ("image_start_token_id", "image_end_token_id"),
                   ("boi_token_id", "eoi_token_id"))
_AUDIO_BRACKETS = (("audio_bos_token_id", "audio_eos_token_id"), ("audio_start_token_id", "audio_end_token_id"),
                   ("boa_token_id", "eoa_token_id"))


def _placeholder_blocks(config: Any, token: int, count: int, brackets: tuple[tuple[str, str], ...]) -> list[list[int]]:
    """The placeholder ids of one image or clip: ``count`` media tokens, then the same wrapped in the family's start
    and end tokens where the config names them (Qwen-VL's ``vision_start_token_id``, GLM-4V's
    ``image_start_token_id``, Music Flamingo's ``audio_bos_token_id``: the rope index finds media by them)."""
    blocks = [[token] * count]
    for start, end in brackets:
        first, last = getattr(config, start, None), getattr(config, end, None)
        if isinstance(first, int) and isinstance(last, int):
            blocks.insert(0, [first, *blocks[-1], last])
    return blocks


def _token(config: Any, *names: str) -> int | None:
    """The first of ``names`` the config sets to an id."""
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _placed(text: dict[str, torch.Tensor], block: list[int]) -> dict[str, torch.Tensor]:
    """``text`` with ``block`` inserted in each row right after its left padding (the mask grown to match)."""
    ids, mask = text["input_ids"], text.get("attention_mask", torch.ones_like(text["input_ids"]))
    rows, masks = [], []
    for row, row_mask in zip(ids, mask, strict=True):
        n_pad = int((row_mask == 0).sum())
        rows.append(torch.cat([row[:n_pad], torch.tensor(block, dtype=row.dtype), row[n_pad:]]))
        masks.append(torch.cat([row_mask[:n_pad], torch.ones(len(block), dtype=row_mask.dtype), row_mask[n_pad:]]))
    out = {"input_ids": torch.stack(rows)}
    if "attention_mask" in text:
        out["attention_mask"] = torch.stack(masks)
    return out


def with_image(model: Any, gen: torch.Generator, batch: int, text: dict[str, torch.Tensor],
                context: dict[str, Any] | None = None) -> dict[str, Any]:
    """One image per row (:func:`_image_kwargs`) and as many image tokens as the vision tower makes features (wrapped
    in the family's start and end tokens where it has them), right after each row's left padding. Falls back to the
    text alone (``{}``) when the model needs more than that or takes no plain image-token id: the eager forward
    decides."""
    config = model.config
    # (a head class without it, ModernVBERT's masked LM: its base model's; a video-only model's video features and
    # tokens, InstructBLIP-Video's)
    token = _token(config, "image_token_id", "image_token_index", "video_token_id", "video_token_index")
    features = next((f for name in ("get_image_features", "get_video_features")
                     for f in (getattr(model, name, None), getattr(model.base_model, name, None)) if f is not None), None)
    if token is None or features is None:
        return {}
    hidden = config.get_text_config(decoder=True).hidden_size
    params = inspect.signature(model.forward).parameters
    wanted = inspect.signature(features).parameters  # (inputs already built that it takes: InstructBLIP's
    given = {k: v for k, v in (context or {}).items() if k in wanted and k not in text}  # Q-Former prompt)
    for extra in _image_kwargs(model, features, gen, batch):
        extra = {**given, **extra}
        try:
            with torch.no_grad():
                per_image = _feature_count(features(**_for_features(config, extra, wanted))) // (batch * hidden)
        except Exception:  # noqa: BLE001 - not this layout: the next one
            continue
        for block in _placeholder_blocks(config, token, per_image, _IMAGE_BRACKETS):
            candidate = {**_placed(text, block), **extra}
            if "mm_token_type_ids" in params:  # (the processor's: 1 on image tokens; Qwen3-VL's M-RoPE reads it)
                candidate["mm_token_type_ids"] = (candidate["input_ids"] == token).long()
            if runs(model, candidate):  # else this family needs more than pixels + tokens: next layout, or text only
                return candidate
    return {}


_AUDIO_MASKS = ("input_features_mask", "feature_attention_mask")
_MAX_AUDIO_TOKENS = 64


def _audio_kwargs(model: Any, gen: torch.Generator, batch: int, params: Any) -> Iterator[dict[str, Any]]:
    """One clip per row: ``input_features`` (:func:`sample_features`) as they are and transposed, each with its mask of
    ones over the frames where the forward takes one (``input_features_mask``, Qwen2-Audio's
    ``feature_attention_mask``), then without."""
    mel = config_value(model.config, "num_mel_bins")
    names = [n for n in _AUDIO_MASKS if n in params]
    clips = [sample_features(model, gen, batch)]
    window = config_value(model.config, "n_window")  # a tower that reads whole windows of 2 * n_window frames (Qwen3-ASR)
    if isinstance(mel, int) and isinstance(window, int) and 0 < window <= 512:
        clips.append(torch.randn(batch, mel, 2 * window, generator=gen))
    width = feature_width(model.config)
    for features in chain.from_iterable(feature_layouts(c) for c in clips):
        frames = features.shape[1] if width == features.shape[-1] else features.shape[-1]
        if names:
            yield {"input_features": features, **dict.fromkeys(names, torch.ones(batch, frames, dtype=torch.long))}
        yield {"input_features": features}


def _audio_counts(model: Any, extra: dict[str, Any], batch: int) -> Iterator[int]:
    """How many audio tokens a row's clip may take: what ``get_audio_features`` gives per row, where the model has
    one that runs on ``extra``, else every count up to :data:`_MAX_AUDIO_TOKENS` (the forward's own check of tokens
    against features decides: Qwen2-Audio has no ``get_audio_features``; one token last, as its legacy prompt of one
    token per clip, which the model expands itself, is not what its processor writes)."""
    features = getattr(model, "get_audio_features", None) or getattr(model.base_model, "get_audio_features", None)
    if features is not None:
        hidden = model.config.get_text_config(decoder=True).hidden_size
        try:
            with torch.no_grad():
                count = _feature_count(features(**extra)) // (batch * hidden)
        except Exception:  # noqa: BLE001 - it wants more than the features: count by trying
            count = 0
        if count:
            yield count
            return
    yield from (*range(2, _MAX_AUDIO_TOKENS + 1), 1)


def with_audio(model: Any, gen: torch.Generator, batch: int, text: dict[str, torch.Tensor],
               ahead: int = 0) -> dict[str, Any]:
    """One clip per row (:func:`_audio_kwargs`) and its audio tokens (wrapped in the family's start and end tokens
    where it has them) right after each row's left padding, as the audio-text-to-text processors lay out a prompt
    (Audio Flamingo 3, GLM-ASR, Qwen2-Audio, Qwen3-ASR). ``{}`` (the text alone) where the config names no audio
    token or no layout and count runs in eager. ``ahead``: see :func:`.media.aligned_features`."""
    config = model.config
    token = _token(config, "audio_token_id", "audio_token_index")
    params = inspect.signature(model.forward).parameters
    if "input_features" not in params:
        return {}
    if token is None:  # no audio token: one embedding added to each position (Voxtral Realtime), else a clip the
        mel = config_value(config, "num_mel_bins")  # text goes with (CLVP's conditioning clip)
        aligned = aligned_features(model, text, mel, gen, ahead) if isinstance(mel, int) else {}
        beside = ({**text, **extra} for extra in _audio_kwargs(model, gen, batch, params))
        return aligned or next((c for c in beside if runs(model, c)), {})
    for extra in _audio_kwargs(model, gen, batch, params):
        for count in _audio_counts(model, extra, batch):
            for block in _placeholder_blocks(config, token, count, _AUDIO_BRACKETS):
                candidate = {**_placed(text, block), **extra}
                if runs(model, candidate):
                    return candidate
    return {}
