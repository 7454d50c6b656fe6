"""Seeded sample inputs for a tiny model, chosen by its ``main_input_name`` and its forward signature.

Text: ``input_ids`` ``[2, seq]`` with row 0 left-padded by two positions and its ``attention_mask``; encoder-decoder
models also get ``decoder_input_ids`` starting with their decoder start token (not for generation, which starts the
decoder itself). Images: ``pixel_values`` ``[2, channels, size, size]`` at the config's image size. Audio:
``input_features`` ``[2, mel_bins, 2 * max_source_positions]`` (Whisper layout) or ``[2, frames, features]``, and raw
``input_values`` ``[2, 1600]``; audio-text-to-text models get one clip per row and its audio tokens (the count
``get_audio_features`` gives, else the one the forward accepts). Image-text-to-text models get one image per row with
as many image tokens as their vision tower makes features (wrapped in the family's image start and end tokens where it
has them, with the processor's ``mm_token_type_ids`` where the forward takes them), where its ``get_image_features``
takes pixels (with their sizes, a second tower's pixels, a pixel mask), flattened patches and a ``grid_thw``
(Qwen-VL-like) or NaFlex patches, and an image-token id is all they need (else text only); families with a
hand-written tiny case (:data:`hfexport.tools.matrix.shrink.FROM_TINY_CASES`) use its inputs. Vision towers that take
patches and a ``grid_thw``, videos, mono audio and transposed features: :mod:`.media` tries the other layouts of a
tensor until the model runs on one; a required media input of a text-first class is added. Images of a windowed
(Swin-like) tower are large enough for a whole window at its last stage; larger sides are tried where 32 pixels are
too few. Layout models (a ``bbox`` parameter) get one ordered box per token. Time series (``past_values``):
:mod:`.series`. Hidden-state inputs (``inputs_embeds``, ``query_embeds``, ``latents``) get ``[2, seq, width]`` for a
width of the config; NaFlex towers (``spatial_shapes``, ``pixel_position_ids``) patches; a codebook decoder one row
per codebook; a codec audio of 16 frames at its total stride; a media ``main_input_name`` the forward does not take
goes to its one missing required input.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterator
from itertools import chain
from typing import Any

import torch

from .named_inputs import companions, main_alias, trajectory_or_patches
from .media import GRID_KEYS, audio_layouts, feature_layouts, feature_masks, first_that_runs, grid_candidates, \
    image_layouts, image_sides, packed_candidates, patch_candidates, runs, variants, window_side, aligned_features
from .series import series_inputs
from .shrink import FROM_TINY_CASES

__all__ = ["NoInputRecipe", "sample_inputs"]

_PAD, _FIRST_ID, _LAST_ID = 0, 3, 248
_FEATURE_KEYS = ("input_features", "audio_mel")  # (Gemma 3n's audio tower names its log-mel features audio_mel)
_FEATURE_SIZES = ("feature_size", "input_feat_per_channel", "num_mel_bins", "input_dim", "feature_projection_input_dim",
                  "input_feat_size")
_MEL_BINS = (128, 80)


class NoInputRecipe(Exception):
    """The matrix has no sample-input recipe for this model's main input."""


def _find(config: Any, *names: str) -> Any:
    """The first of ``names`` set on the config or on one of its vision/audio/encoder sub-configs (a codec's
    semantic model: X-Codec 2's mel features are its Wav2Vec2-BERT's; CLVP's are its speech decoder's)."""
    for cfg in (config, *(getattr(config, s, None) for s in ("vision_config", "audio_config", "encoder_config",
                                                             "encoder", "backbone_config", "semantic_model_config",
                                                             "decoder_config"))):
        for name in names:
            value = getattr(cfg, name, None) if cfg is not None else None
            if value is not None:
                return value
    return None


def _tower(config: Any, kind: str) -> bool:
    """Whether the model may have a ``kind`` (``vision``, ``audio``) tower: not where its config leaves
    ``{kind}_config`` None (an embedding model built text-only, EmbeddingGemma 2's default, refuses media)."""
    return not (hasattr(config, f"{kind}_config") and getattr(config, f"{kind}_config") is None)


def _vocab(config: Any) -> int:
    """The vocabulary size: the top-level value first (some ``get_text_config()`` answer a default sub-config), then
    the text config's, then a wrapped model's (FastSpeech 2 with its vocoder: ``model_config``)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    return getattr(config, "vocab_size", None) or getattr(text, "vocab_size", None) \
        or getattr(getattr(config, "model_config", None), "vocab_size", None) or _LAST_ID


def _text(model: Any, gen: torch.Generator, batch: int, seq: int, params: Any) -> dict[str, torch.Tensor]:
    config = model.config
    vocab = _vocab(config)
    ids = torch.randint(_FIRST_ID, max(_FIRST_ID + 1, min(vocab, _LAST_ID)), (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    if batch >= 2:
        ids[0, :2], mask[0, :2] = _PAD, 0
    out = {"input_ids": ids}
    if "attention_mask" in params:
        out["attention_mask"] = mask
    return out


def _named_text(model: Any, gen: torch.Generator, batch: int, seq: int, params: Any,
                prefix: str) -> dict[str, torch.Tensor]:
    """Text ids (and their mask where the forward takes one) under ``{prefix}input_ids``."""
    text = _text(model, gen, batch, seq, params if not prefix else ())
    out = {f"{prefix}input_ids": text["input_ids"]}
    if f"{prefix}attention_mask" in params:
        out[f"{prefix}attention_mask"] = (text["input_ids"] != _PAD).long()
    return out


def _decoder_ids(model: Any, gen: torch.Generator, batch: int, seq: int) -> torch.Tensor:
    start = getattr(model.generation_config, "decoder_start_token_id", None)
    if start is None:
        start = getattr(model.config, "decoder_start_token_id", None)
    ids = torch.randint(_FIRST_ID, _LAST_ID, (batch, max(1, (seq + 1) // 2)), generator=gen)
    ids = ids % _vocab(model.config)
    ids[:, 0] = start if isinstance(start, int) else _PAD
    return ids


def _pixels(model: Any, gen: torch.Generator, batch: int) -> torch.Tensor:
    size = _find(model.config, "image_size", "input_size", "crop_size") or 32
    h, w = (size, size) if isinstance(size, int) else tuple(size)[-2:]
    windowed = window_side(getattr(model.config, "vision_config", None) or model.config)
    h, w = max(h, windowed), max(w, windowed)
    channels = _find(model.config, "num_channels", "in_channels") or 3
    return torch.randn(batch, channels, h, w, generator=gen)


def _audio(gen: torch.Generator, batch: int) -> torch.Tensor:
    return torch.randn(batch, 1600, generator=gen)


def _features(model: Any, gen: torch.Generator, batch: int) -> torch.Tensor:
    config = model.config
    mel = _find(config, "num_mel_bins")
    positions = _find(config, "max_source_positions")
    window = _find(config, "n_window")  # a tower that reads whole windows of 2 * n_window frames (Qwen3-ASR's)
    if mel and isinstance(window, int) and 0 < window <= 512:
        return torch.randn(batch, mel, 2 * window, generator=gen)
    if mel and (width := _feature_width(config)) != mel:
        return torch.randn(batch, 32, width, generator=gen)
    if mel and positions:
        return torch.randn(batch, mel, 2 * positions, generator=gen)
    feat = _find(config, *_FEATURE_SIZES)
    # none named (its feature extractor's): 128 log-mel bins, the usual size (80 tried next: sample_inputs)
    return torch.randn(batch, 32, feat or _MEL_BINS[0], generator=gen)


def _feature_width(config: Any) -> int | None:
    """The width of one feature frame: the mel bins, times the frames a low-frame-rate front end stacks in one step
    (FunASR's ``num_stacked_frames``)."""
    mel, stacked = _find(config, "num_mel_bins"), _find(config, "num_stacked_frames")
    return mel * stacked if isinstance(mel, int) and isinstance(stacked, int) and stacked > 1 else mel


def _is_hidden_like(name: str) -> bool:
    """A float input of hidden states rather than ids or media: ``inputs_embeds``, BLIP-2 Q-Former's
    ``query_embeds``, a drafter's ``context_hidden_states``, a codec decoder's ``latents``."""
    return isinstance(name, str) and (name.endswith(("_embeds", "hidden_states")) or name == "latents")


def _widths(config: Any) -> list[int]:
    """Widths a hidden-state input may have: the hidden size first, then the config's other ``*_dim`` /
    ``*_size`` values (a codec's latent or codebook dim)."""
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    first = [getattr(c, "hidden_size", None) for c in (config, text)]
    rest = [v for k, v in sorted(config.to_dict().items()) if k.endswith(("_dim", "_size")) and "vocab" not in k]
    return [w for w in dict.fromkeys(first + rest) if isinstance(w, int) and not isinstance(w, bool) and 1 < w <= 1024]


def _hidden_states(model: Any, gen: torch.Generator, batch: int, seq: int, names: list[str],
                   base: dict[str, Any], params: Any) -> Iterator[dict[str, Any]]:
    """``base`` with random ``[B, seq, width]`` (then ``[B, width, seq]``) tensors under ``names[0]``, for each of
    the config's candidate widths; the other ``names`` get the same width, then each other width (a drafter's
    context is the target model's width), and, where a cross-attention block reads them (BLIP-2's Q-Former), so do
    optional ``encoder_hidden_states``."""
    widths = _widths(model.config)
    others = names[1:] + (["encoder_hidden_states"] if "encoder_hidden_states" in params and
                          "encoder_hidden_states" not in names else [])
    for width in widths:
        states = torch.randn(batch, seq, width, generator=gen)
        for tensor in (states, states.transpose(1, 2).contiguous()):
            yield {**base, **dict.fromkeys(names, tensor)}
            for other in widths if others else ():
                context = torch.randn(batch, seq, other, generator=gen)
                yield {**base, names[0]: tensor, **dict.fromkeys(others, context)}


def _with_boxes(inputs: dict[str, Any], gen: torch.Generator) -> Iterator[dict[str, Any]]:
    """``inputs`` with a ``bbox`` ``[B, S, 4]`` of one box per token, ``x0 <= x1`` and ``y0 <= y1``: int
    coordinates in ``[0, 1000]`` (LayoutLM's), then the same boxes normalised to ``[0, 1]``, then without boxes."""
    batch, seq = inputs["input_ids"].shape
    corner = torch.randint(0, 500, (batch, seq, 2), generator=gen)
    size = torch.randint(0, 501, (batch, seq, 2), generator=gen)
    boxes = torch.cat([corner, corner + size], dim=-1)
    yield {**inputs, "bbox": boxes}
    yield {**inputs, "bbox": boxes.float() / 1000}
    yield inputs


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
    pinpoints, side = getattr(config, "image_grid_pinpoints", None), _find(config, "image_size")
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
    if not {"args", "kwargs"} < {*params} and hasattr(model.base_model, "get_image_features"):  # (a head class's
        params = inspect.signature(model.base_model.get_image_features).parameters  # pass-through: its base's)
    if "target_sizes" in params:  # MiniCPM-V-like: patches packed in one row
        yield from packed_candidates(getattr(config, "vision_config", None) or config, gen, batch)
        return
    if any(k in params for k in GRID_KEYS):  # (with what the forward takes beside the grid: a get_image_features
        # that passes its kwargs on may need them, VideoLLaMA 3's image_merge_sizes)
        both = {**inspect.signature(model.forward).parameters, **params}
        yield from grid_candidates(getattr(config, "vision_config", None) or config, gen, batch, both)
        return
    images = _pixels(model, gen, batch)
    if "spatial_shapes" in params:  # a NaFlex tower (LFM2-VL's SigLIP 2): one image per row, cut into patches
        yield from patch_candidates(getattr(config, "vision_config", None) or config, gen, batch, images.shape[-1],
                                    params)
        return
    extra = {}
    if "image_sizes" in params:
        extra["image_sizes"] = torch.tensor([list(images.shape[-2:])] * batch)
    for name in params:  # a second tower's own images (DeepSeek-VL hybrid's high_res_pixel_values), at its size
        prefix = name[: -len("_pixel_values")] if name.endswith("_pixel_values") else None
        side = _find(getattr(config, f"{prefix}_vision_config", None), "image_size") if prefix else None
        if isinstance(side, int):
            extra[name] = torch.randn(batch, images.shape[1], side, side, generator=gen)
    layouts = [images, images.unsqueeze(1)]
    crops = (2, 3, 5, _crop_count(config, images.shape[-2:])) if "image_sizes" in params else ()
    layouts += [images.unsqueeze(1).repeat(1, n, 1, 1, 1) for n in dict.fromkeys(crops) if n]
    for pixels in layouts:
        yield {"pixel_values": pixels, **extra}
        if "pixel_attention_mask" in params:  # then with its mask, where the tower needs one (Idefics3-like)
            mask = torch.ones(*pixels.shape[:-3], *pixels.shape[-2:], dtype=torch.long)
            yield {"pixel_values": pixels, **extra, "pixel_attention_mask": mask}
            if pixels.dim() == 5:  # (or a mask of the real tiles, Granite Docling's)
                tiles = torch.ones(*pixels.shape[:2], dtype=torch.bool)
                yield {"pixel_values": pixels, **extra, "pixel_attention_mask": tiles}
    patch, (b, c, h, w) = _find(config, "patch_size"), images.shape
    if isinstance(patch, int) and h % patch == 0 and w % patch == 0:  # every image's patches flattened, one per row
        yield {"pixel_values": images.reshape(b, c, h // patch, patch, w // patch, patch)  # (NeoMME's)
               .permute(0, 2, 4, 1, 3, 5).reshape(-1, c * patch * patch)}


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


def _with_image(model: Any, gen: torch.Generator, batch: int, text: dict[str, torch.Tensor],
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
                per_image = _feature_count(features(**extra)) // (batch * hidden)
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
    """One clip per row: ``input_features`` (:func:`_features`) as they are and transposed, each with its mask of
    ones over the frames where the forward takes one (``input_features_mask``, Qwen2-Audio's
    ``feature_attention_mask``), then without."""
    mel = _find(model.config, "num_mel_bins")
    names = [n for n in _AUDIO_MASKS if n in params]
    clips = [_features(model, gen, batch)]
    window = _find(model.config, "n_window")  # a tower that reads whole windows of 2 * n_window frames (Qwen3-ASR)
    if isinstance(mel, int) and isinstance(window, int) and 0 < window <= 512:
        clips.append(torch.randn(batch, mel, 2 * window, generator=gen))
    width = _feature_width(model.config)
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


def _with_audio(model: Any, gen: torch.Generator, batch: int, text: dict[str, torch.Tensor]) -> dict[str, Any]:
    """One clip per row (:func:`_audio_kwargs`) and its audio tokens (wrapped in the family's start and end tokens
    where it has them) right after each row's left padding, as the audio-text-to-text processors lay out a prompt
    (Audio Flamingo 3, GLM-ASR, Qwen2-Audio, Qwen3-ASR). ``{}`` (the text alone) where the config names no audio
    token or no layout and count runs in eager."""
    config = model.config
    token = _token(config, "audio_token_id", "audio_token_index")
    params = inspect.signature(model.forward).parameters
    if "input_features" not in params:
        return {}
    if token is None:  # no audio token: one embedding added to each position (Voxtral Realtime), else a clip the
        mel = _find(config, "num_mel_bins")  # text goes with (CLVP's conditioning clip)
        aligned = aligned_features(model, text, mel, gen) if isinstance(mel, int) else {}
        beside = ({**text, **extra} for extra in _audio_kwargs(model, gen, batch, params))
        return aligned or next((c for c in beside if runs(model, c)), {})
    for extra in _audio_kwargs(model, gen, batch, params):
        for count in _audio_counts(model, extra, batch):
            for block in _placeholder_blocks(config, token, count, _AUDIO_BRACKETS):
                candidate = {**_placed(text, block), **extra}
                if runs(model, candidate):
                    return candidate
    return {}


def sample_inputs(model: Any, model_type: str, batch: int = 2, seq: int = 6,
                  for_generation: bool = False) -> dict[str, torch.Tensor]:
    """Forward (or ``generate``) kwargs for ``model``, seeded by ``(batch, seq)``.

    Raises:
        NoInputRecipe: When the model's main input is not one the matrix knows how to build.
    """
    if model_type in FROM_TINY_CASES:
        from ...testing.tiny import TINY_CASES

        inputs = TINY_CASES[FROM_TINY_CASES[model_type]].inputs(batch, seq)
        return {k: v for k, v in inputs.items() if not (for_generation and k.startswith("decoder"))}
    gen = torch.Generator().manual_seed(1_000 * batch + seq)
    params = inspect.signature(model.forward).parameters
    required = [n for n, p in params.items() if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    if any(k in required for k in GRID_KEYS):  # a Qwen-VL-like vision tower: patches and their grid
        config = getattr(model.config, "vision_config", None) or model.config
        return first_that_runs(model, grid_candidates(config, gen, batch, params))
    main = main_alias(model, getattr(model, "main_input_name", "input_ids"), params)
    if (main == "pixel_values" and "spatial_shapes" in params) or {"pixel_values", "pixel_position_ids"} <= {*required}:
        config = getattr(model.config, "vision_config", None) or model.config  # a NaFlex tower: patches
        side = _pixels(model, gen, batch).shape[-1]
        return first_that_runs(model, patch_candidates(config, gen, batch, side, params))
    if main == "pixel_values" and "target_sizes" in params and "input_ids" not in params:  # a MiniCPM-V-like tower
        return first_that_runs(model, packed_candidates(model.config, gen, batch))
    if main == "input_ids":
        out: dict[str, torch.Tensor] = _text(model, gen, batch, seq, params)
    elif main in ("pixel_values", "pixel_values_videos"):
        out = {main: _pixels(model, gen, batch)}
    elif main in _FEATURE_KEYS:
        out = {main: _features(model, gen, batch)}
    elif main == "input_values":
        out = {"input_values": _audio(gen, batch)}
    elif main == "past_values" and (out := series_inputs(model, gen, batch, params)):
        return out
    elif (named := trajectory_or_patches(model, main, params, gen, batch)) is not None:
        out = named  # (a trajectory, flattened patches: .named_inputs)
    elif _is_hidden_like(main):
        names = [main, *(n for n in required if n != main and _is_hidden_like(n))]
        return first_that_runs(model, _hidden_states(model, gen, batch, seq, names, {}, params))
    else:
        raise NoInputRecipe(f"no sample-input recipe for the main input {main!r}")
    alias = None  # a media main_input_name the forward does not take, for its one missing hidden-state input
    missing = [n for n in required if n not in out]
    if main != "input_ids" and main not in params and len(missing) == 1 and _is_hidden_like(missing[0]):
        alias = missing[0]  # (VibeVoice's acoustic encoder: input_values, forward(hidden_states); not a tracker's
        out[alias] = out.pop(main)  # inference_session)
    if main == "input_ids" and "pixel_values" in params and model.can_generate():  # image-text-to-text
        out.update(_with_image(model, gen, batch, out))
    elif main == "input_ids" and "input_features" in params and model.can_generate():  # audio-text-to-text
        out.update(_with_audio(model, gen, batch, out))
    elif main == "input_ids" and "input_features" in params and not model.can_generate() \
            and _tower(model.config, "audio"):
        out["input_features"] = _features(model, gen, batch)  # CLAP: text and audio
    elif main == "input_ids" and "pixel_values" in params and not model.can_generate() \
            and _tower(model.config, "vision"):
        # CLIP-like dual encoders
        # (or an encoder over text with image tokens: ModernVBERT)
        out.update(_with_image(model, gen, batch, out) or {"pixel_values": _pixels(model, gen, batch)})
    elif main in ("pixel_values", "pixel_values_videos") and "input_ids" in params and not model.can_generate():
        out.update(_text(model, gen, batch, seq, params))
    # an image-first class whose text is optional (BLIP, Kosmos-2) or required (BLIP-2): tried with it below
    text_too = main in ("pixel_values", "pixel_values_videos") and "input_ids" in params and "input_ids" not in out
    for name in required:  # media a text-first class also requires (PE Audio: input_ids and input_values; PE
        if name not in out and name in ("pixel_values", "pixel_values_videos", "input_values"):  # Video: a video)
            out[name] = _audio(gen, batch) if name == "input_values" else _pixels(model, gen, batch)
        elif name not in out and name in _FEATURE_KEYS:  # a codec's semantic branch (X-Codec 2: waveform + mel)
            out[name] = _features(model, gen, batch)
        elif name not in out and name.endswith("input_ids") and not (text_too and name == "input_ids"):
            out.update(_named_text(model, gen, batch, seq, params, name[: -len("input_ids")]))  # InstructBLIP's
    if main == "input_values" and "pixel_values_videos" in params and "pixel_values_videos" not in out:
        out["pixel_values_videos"] = _pixels(model, gen, batch)  # an audio-video encoder: both streams, each optional
        # in its signature (PE Audio-Video's; its layouts below make it a video)
    out = companions(model, out, params, gen)  # (LXMERT's region features, SegGPT's prompt pair)
    if hidden := [n for n in required if n not in out and _is_hidden_like(n)]:  # BLIP-2 Q-Former's query_embeds
        out = first_that_runs(model, _hidden_states(model, gen, batch, seq, hidden, out, params))
    if getattr(model.config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        out["decoder_input_ids"] = _decoder_ids(model, gen, batch, seq)
    if "lang_ids" in params and isinstance(out.get("input_ids"), torch.Tensor):  # X-MOD's adapters: language 0
        out["lang_ids"] = torch.zeros(out["input_ids"].shape[0], dtype=torch.long)
    if "bbox" in params and isinstance(out.get("input_ids"), torch.Tensor):  # a layout model: a box per token
        out = first_that_runs(model, _with_boxes(out, gen))
    frames = _find(model.config, "num_frames", "frames_per_clip") or 2
    pixels = out.get("pixel_values")
    sides = image_sides(pixels.shape[-1]) if isinstance(pixels, torch.Tensor) and pixels.dim() == 4 else []
    layouts = {"pixel_values": image_layouts(frames, sides), "pixel_values_videos": image_layouts(frames),
               "input_values": audio_layouts, **dict.fromkeys(_FEATURE_KEYS, feature_layouts)}
    if main == "input_values" and isinstance(mel_bins := _find(model.config, "num_mel_bins"), int):
        # a spectrogram under the raw-audio name (AST): [B, max_length frames, mel bins] after the raw layouts
        frames = _find(model.config, "max_length")
        frames = frames if isinstance(frames, int) and 0 < frames <= 4096 else 32
        spectrogram = torch.randn(batch, frames, mel_bins, generator=gen)
        layouts["input_values"] = lambda v: chain(audio_layouts(v), feature_layouts(spectrogram))
    ratios = _find(model.config, "downsampling_ratios", "upsampling_ratios")
    hop = math.prod(ratios) if isinstance(ratios, (list, tuple)) and all(isinstance(r, int) for r in ratios) else 1
    if main == "input_values" and 1920 < 16 * hop <= 160_000:  # a codec's 16 frames at its total stride
        long_audio, short = torch.randn(batch, 16 * hop, generator=gen), layouts["input_values"]
        layouts["input_values"] = lambda v: chain(short(v), audio_layouts(long_audio))
        if isinstance(out.get("input_features"), torch.Tensor):  # its semantic branch's features: a frame a hop
            frames = torch.randn(batch, 16, out["input_features"].shape[-1], generator=gen)
            layouts["input_features"] = lambda f: chain(feature_layouts(f), feature_layouts(frames))
    channels = getattr(getattr(model.config, "decoder_config", None), "num_channels", None)
    if isinstance(out.get("decoder_input_ids"), torch.Tensor) and isinstance(channels, int) and channels > 1:
        # a decoder of one id per audio channel (Dia's): [B, T, channels]
        layouts["decoder_input_ids"] = lambda ids: iter((ids, ids.unsqueeze(-1).repeat(1, 1, channels)))
    if alias is not None and main in layouts:
        layouts[alias] = layouts[main]
    codebooks = _find(model.config, "num_codebooks")
    if main == "input_ids" and isinstance(codebooks, int) and codebooks > 1:  # MusicGen's rows: one per codebook
        layouts["input_ids"] = lambda ids: iter((ids, ids.repeat_interleave(codebooks, dim=0)))
    feature_key = main if main in _FEATURE_KEYS else "input_features"
    mel = _find(model.config, "num_mel_bins")
    # every mask of the features the forward takes, optional ones too: Audio Flamingo 3's encoder sums its
    # input_features_mask, None by default
    masks = feature_masks(list(params), mel or _find(model.config, *_FEATURE_SIZES), feature_key)
    if main in _FEATURE_KEYS and not _find(model.config, *_FEATURE_SIZES):  # no size named: 80 bins too
        layouts[main] = lambda f: chain(feature_layouts(f), feature_layouts(f[..., : _MEL_BINS[1]].contiguous()))
    with_text = None
    if text_too:  # with image placeholders where the model takes them (BLIP-2's query tokens), else plain text
        text = _text(model, gen, batch, seq, params)
        with_text = {**out, **text, **_with_image(model, gen, batch, text, out)}
    # the aliased main input may be hidden states after all (VibeVoice's acoustic decoder: latents)
    states = _hidden_states(model, gen, batch, seq, [alias], out, params) if alias and _is_hidden_like(alias) else ()
    out = first_that_runs(model, chain(variants(out, layouts, masks),
                                       variants(with_text, layouts, masks) if with_text else (), states))
    return {k: v for k, v in out.items() if not (for_generation and k == "decoder_input_ids")}
