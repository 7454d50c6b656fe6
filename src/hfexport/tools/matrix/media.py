"""Image, video and audio sample inputs whose layout the config does not say: other layouts of the same tensor,
tried in order until the tiny model runs on one eagerly (it is a few milliseconds each).

- vision towers of Qwen-VL-like models (a required ``grid_thw``): flattened patches ``[patches, C * T * P * P]``
  (or ``[patches, C, P, P]``, ``[patches, C, T, P, P]``) of two images of ``2 * merge`` patches a side, with their
  ``grid_thw`` rows ``[1, side, side]`` (``image_grid_hw`` rows ``[side, side]``: Nemotron-H Omni's); a NaFlex
  tower's (``spatial_shapes``) patches of one image per row;
- towers that take each image's patch grid (``target_sizes``, MiniCPM-V's): the images' patches packed in one row;
- the tensors themselves, sized from the config (:func:`config_value` reads a size off the config or its vision,
  audio, encoder, backbone or decoder sub-config): :func:`sample_pixels`, :func:`sample_features`;
- ``pixel_values`` ``[B, C, H, W]``, then as a video ``[B, frames, C, H, W]`` / ``[B, C, frames, H, W]`` (frames from
  the config's ``num_frames``), then one image per row ``[B, 1, C, H, W]``, then larger square images (64, 128, 224
  pixels); a windowed tower's images are large enough for a whole window at its last stage from the first try;
- ``input_values`` ``[B, samples]``, then mono ``[B, 1, samples]``, at 1600 then 1920 samples (a multiple of 96 and
  of 320-sample hops);
- ``input_features`` ``[B, mel, frames]`` and ``[B, frames, mel]``; a required ``*_mask`` of the features gets ones
  over the frames.

Example:
    >>> [tuple(t.shape) for t in audio_layouts(torch.zeros(2, 1600))][:2]
    [(2, 1600), (2, 1, 1600)]
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["GRID_KEYS", "FEATURE_SIZES", "MEL_BINS", "config_value", "sample_pixels", "sample_features",
           "feature_width", "first_that_runs", "runs", "variants", "grid_candidates", "patch_candidates",
           "packed_candidates", "window_side",
           "image_sides", "image_layouts", "audio_layouts", "feature_layouts", "feature_masks", "aligned_features"]

GRID_KEYS = ("grid_thw", "image_grid_thw", "image_grid_hw")  # (the last: rows of [height, width] only, no time)
FEATURE_SIZES = ("feature_size", "input_feat_per_channel", "num_mel_bins", "input_dim", "feature_projection_input_dim",
                 "input_feat_size")
MEL_BINS = (128, 80)


_SUB_CONFIGS = ("vision_config", "audio_config", "encoder_config", "encoder", "backbone_config", "semantic_model_config",
                "decoder_config")


def config_value(config: Any, *names: str) -> Any:
    """The first of ``names`` set on the config or on one of its vision/audio/encoder sub-configs (a codec's
    semantic model: X-Codec 2's mel features are its Wav2Vec2-BERT's; CLVP's are its speech decoder's)."""
    subs = [getattr(config, s, None) for s in _SUB_CONFIGS]
    for cfg in (config, *subs):
        for name in names:
            value = getattr(cfg, name, None) if cfg is not None else None
            if value is not None:
                return value
    # then one level further down those (Nemotron 3.5 Transcribe: audio_config.asr_config.num_mel_bins)
    from transformers import PretrainedConfig

    for cfg in subs:  # (a sub-config may be a plain value: FastSpeech 2 Conformer's)
        nested = [v for v in vars(cfg).values() if isinstance(v, PretrainedConfig)] \
            if isinstance(cfg, PretrainedConfig) else []
        for sub in nested:
            for name in names:
                if (value := getattr(sub, name, None)) is not None:
                    return value
    return None


def sample_pixels(model: Any, gen: torch.Generator, batch: int) -> torch.Tensor:
    """``[batch, channels, H, W]`` at the config's image size (32 pixels where it names none), large enough for a
    windowed tower's last stage."""
    size = config_value(model.config, "image_size", "input_size", "crop_size") or 32
    h, w = (size, size) if isinstance(size, int) else tuple(size)[-2:]
    windowed = window_side(getattr(model.config, "vision_config", None) or model.config)
    h, w = max(h, windowed), max(w, windowed)
    channels = config_value(model.config, "num_channels", "in_channels") or 3
    return torch.randn(batch, channels, h, w, generator=gen)


def sample_features(model: Any, gen: torch.Generator, batch: int) -> torch.Tensor:
    """Audio features of one clip per row, sized from the config: ``[B, mel, 2 * n_window]`` (a windowed tower),
    ``[B, 32, mel x stacked frames]`` (a low-frame-rate front end), ``[B, mel, 2 * max_source_positions]`` (Whisper's
    layout), else ``[B, 32, feature size]``."""
    config = model.config
    mel = config_value(config, "num_mel_bins")
    positions = config_value(config, "max_source_positions")
    window = config_value(config, "n_window")  # a tower that reads whole windows of 2 * n_window frames (Qwen3-ASR's)
    if mel and isinstance(window, int) and 0 < window <= 512:
        return torch.randn(batch, mel, 2 * window, generator=gen)
    if mel and (width := feature_width(config)) != mel:
        return torch.randn(batch, 32, width, generator=gen)
    if mel and positions:
        return torch.randn(batch, mel, 2 * positions, generator=gen)
    feat = config_value(config, *FEATURE_SIZES)
    # none named (its feature extractor's): 128 log-mel bins, the usual size (80 tried next: sample_inputs)
    return torch.randn(batch, 32, feat or MEL_BINS[0], generator=gen)


def feature_width(config: Any) -> int | None:
    """The width of one feature frame: the mel bins, times the frames a low-frame-rate front end stacks in one step
    (FunASR's ``num_stacked_frames``)."""
    mel, stacked = config_value(config, "num_mel_bins"), config_value(config, "num_stacked_frames")
    return mel * stacked if isinstance(mel, int) and isinstance(stacked, int) and stacked > 1 else mel


def runs(model: Any, candidate: dict[str, Any]) -> bool:
    """Whether the model's eager forward runs on ``candidate``."""
    try:
        with torch.no_grad():
            model(**candidate)
    except Exception:  # noqa: BLE001 - any failure: not this layout
        return False
    return True


def first_that_runs(model: Any, candidates: Iterator[dict[str, Any]]) -> dict[str, Any]:
    """The first candidate the model runs on eagerly, else the first one (whose error the caller then reports)."""
    first = None
    for candidate in candidates:
        first = candidate if first is None else first
        if runs(model, candidate):
            return candidate
    return first or {}


def variants(base: dict[str, Any], layouts: dict[str, Callable[[torch.Tensor], Iterator[torch.Tensor]]],
             masks: Callable[[dict[str, Any]], Iterator[dict[str, Any]]] | None = None) -> Iterator[dict[str, Any]]:
    """``base``, then ``base`` with one tensor in each of its other layouts (``layouts[key](tensor)``, the first
    being the tensor as it is), then, where two or more tensors have layouts (a codec's waveform and mel features),
    their layouts together; ``masks`` adds the required masks a candidate needs, in each way it may need them."""
    def with_masks(candidate: dict[str, Any]) -> Iterator[dict[str, Any]]:
        yield from (masks(candidate) if masks else [candidate])

    yield from with_masks(base)
    present = {key: list(layouts_of(base[key])) for key, layouts_of in layouts.items()
               if isinstance(base.get(key), torch.Tensor)}
    for key, tensors in present.items():
        for tensor in tensors[1:]:
            yield from with_masks({**base, key: tensor})
    if len(present) > 1:
        for combination in itertools.islice(itertools.product(*present.values()), 64):
            if sum(t is not present[k][0] for k, t in zip(present, combination)) > 1:  # (one apart: yielded above)
                yield from with_masks({**base, **dict(zip(present, combination))})


def _int(value: Any, default: int) -> int:
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default


def grid_candidates(config: Any, gen: torch.Generator, batch: int, params: Any) -> Iterator[dict[str, Any]]:
    """Flattened patches and ``grid_thw`` of ``batch`` images, for a vision tower that takes them instead of
    pixels."""
    get = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)  # noqa: E731
    patch = _int(get("patch_size"), 8)
    channels = _int(get("in_channels", "num_channels"), 3)
    merge = _int(get("spatial_merge_size", "merge_size", "merge_kernel_size"), 1)
    temporal = _int(get("temporal_patch_size", "patch_temporal"), 1)
    side = 2 * merge
    n = batch * side * side
    name = "hidden_states" if "hidden_states" in params else "pixel_values"
    grid_key = next(k for k in GRID_KEYS if k in params)
    grid = torch.tensor([[side, side] if grid_key.endswith("_hw") else [1, side, side]] * batch)
    extra = {k: torch.tensor([merge] * batch) for k in ("merge_sizes", "image_merge_sizes") if k in params}
    for t in dict.fromkeys((temporal, 1, 2)):
        flat = torch.randn(n, channels * t * patch * patch, generator=gen)
        for pixels in (flat, flat.view(n, channels, t, patch, patch) if t > 1 else flat.view(n, channels, patch, patch)):
            yield {name: pixels, grid_key: grid, **extra}
    # then a grid counted in merged tokens, one channels-last block of merge x merge patches each (Inkling 2's:
    # [tokens, P * merge, P * merge, C])
    yield {name: torch.randn(n, patch * merge, patch * merge, channels, generator=gen), grid_key: grid, **extra}


def patch_candidates(config: Any, gen: torch.Generator, batch: int, side: int,
                     params: Any) -> Iterator[dict[str, Any]]:
    """Images already cut into patches, for a NaFlex tower (SigLIP 2: a ``spatial_shapes`` input; Gemma 4's:
    ``pixel_position_ids``): ``pixel_values`` ``[B, patches, C * P * P]`` of a square image of ``side`` pixels (then
    1.5, 2 and 3 times as many, for a pooling kernel that must tile the patch grid), with whichever of
    ``pixel_attention_mask`` (ones), ``spatial_shapes`` (``[side // P] * 2`` per row) and ``pixel_position_ids``
    (``[B, patches, 2]``, the (x, y) of each patch) the forward takes."""
    get = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)  # noqa: E731
    patch = _int(get("patch_size"), 8)
    channels = _int(get("num_channels", "in_channels"), 3)
    for per_side in dict.fromkeys(max(1, side * k // (2 * patch)) for k in (2, 3, 4, 6)):
        n = per_side * per_side
        ys, xs = torch.meshgrid(torch.arange(per_side), torch.arange(per_side), indexing="ij")
        extra = {"pixel_attention_mask": torch.ones(batch, n, dtype=torch.long),
                 "spatial_shapes": torch.tensor([[per_side, per_side]] * batch),
                 "pixel_position_ids": torch.stack([xs.flatten(), ys.flatten()], -1).expand(batch, -1, -1).clone()}
        yield {"pixel_values": torch.randn(batch, n, channels * patch * patch, generator=gen),
               **{k: v for k, v in extra.items() if k in params}}


def packed_candidates(config: Any, gen: torch.Generator, batch: int) -> Iterator[dict[str, Any]]:
    """Every image's patches packed side by side in one row, for a tower that takes each image's patch grid as
    ``target_sizes`` (MiniCPM-V's NaViT layout): ``pixel_values`` ``[1, C, P, batch * n * n * P]`` of ``batch``
    images of ``n x n`` patches (4, then 8: a merger may halve the grid twice), ``target_sizes`` ``[[n, n]] * batch``."""
    get = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)  # noqa: E731
    patch = _int(get("patch_size"), 8)
    channels = _int(get("num_channels", "in_channels"), 3)
    for side in (4, 8):
        yield {"pixel_values": torch.randn(1, channels, patch, batch * side * side * patch, generator=gen),
               "target_sizes": torch.tensor([[side, side]] * batch, dtype=torch.int32)}


def window_side(config: Any) -> int:
    """The image side a windowed tower (Swin-like: ``window_size``, ``patch_size``, ``depths``) needs for a whole
    window at its last stage, ``patch * window * 2 ** (stages - 1)`` (0: not windowed). A Swin run on less shrinks
    its windows for good (``set_shift_and_window_size``), so this is the first size tried, not a fallback."""
    get = lambda *names: next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)  # noqa: E731
    window, patch, depths = _int(get("window_size"), 0), get("patch_size"), get("depths")
    # (a Qwen-VL window is no stage's; DaViT's per-stage patch sizes, Florence-2's, are no Swin's either)
    if not (window and isinstance(patch, int) and isinstance(depths, (list, tuple)) and depths):
        return 0
    return patch * window * 2 ** (len(depths) - 1)


def image_sides(side: int) -> list[int]:
    """Larger square image sides to try after ``side``: 64, 128 and 224 pixels, for towers that downsample a
    32-pixel image to nothing (LeViT's 16x stem, MobileViT, text-line recognisers)."""
    return [s for s in (64, 128, 224) if s > side]


def image_layouts(frames: int, sides: list[int] = ()) -> Callable[[torch.Tensor], Iterator[torch.Tensor]]:
    """``[B, C, H, W]`` as it is, as ``frames`` frames (both axis orders), as one image per row, then resized to
    each of ``sides`` (square)."""
    def layouts(pixels: torch.Tensor) -> Iterator[torch.Tensor]:
        yield pixels
        if pixels.dim() == 4:
            video = pixels.unsqueeze(1).expand(-1, frames, -1, -1, -1).contiguous()
            yield video
            yield video.transpose(1, 2).contiguous()
            yield pixels.unsqueeze(1)
            for side in sides:
                yield torch.nn.functional.interpolate(pixels, size=(side, side), mode="bilinear", align_corners=False)
    return layouts


def audio_layouts(values: torch.Tensor) -> Iterator[torch.Tensor]:
    """Raw audio ``[B, samples]`` as it is, mono ``[B, 1, samples]``, and both at 1920 samples."""
    yield values
    if values.dim() == 2:
        yield values.unsqueeze(1)
        longer = torch.cat([values, values[:, : 1920 - values.shape[1]]], dim=1) if values.shape[1] < 1920 else values
        yield longer
        yield longer.unsqueeze(1)


def feature_layouts(features: torch.Tensor) -> Iterator[torch.Tensor]:
    """Features ``[B, a, b]`` as they are and transposed, then each as one channel ``[B, 1, a, b]`` (CLAP's
    spectrogram image)."""
    yield features
    if features.dim() == 3:
        yield features.transpose(1, 2).contiguous()
        yield features.unsqueeze(1)
        yield features.transpose(1, 2).unsqueeze(1).contiguous()


def feature_masks(parameters: list[str], mel: int | None = None,
                  key: str = "input_features") -> Callable[[dict[str, Any]], Iterator[dict[str, Any]]]:
    """Adds each ``*_mask`` of the features ``key`` (``input_features``, Gemma 3n's ``audio_mel``) among the forward's
    ``parameters`` as ones over the frames (then as a boolean padding mask of no padded frame): the axis that is not
    the ``mel`` bins, else the last axis, then the middle one (the layout decides)."""
    names = [n for n in parameters if n.endswith("_mask") and n.startswith(key)]

    def masks(candidate: dict[str, Any]) -> Iterator[dict[str, Any]]:
        features = candidate.get(key)
        if not names or not isinstance(features, torch.Tensor) or features.dim() != 3:
            yield candidate
            return
        axes = (features.shape[1], features.shape[-1]) if mel == features.shape[-1] else \
            (features.shape[-1], features.shape[1])
        for frames in dict.fromkeys(axes):
            ones = torch.ones(features.shape[0], frames, dtype=torch.long)
            yield {**candidate, **dict.fromkeys(names, ones)}
            # (or a boolean padding mask, True at padded frames: none here; Gemma 3n's audio_mel_mask)
            yield {**candidate, **dict.fromkeys(names, ones == 0)}
    return masks


def aligned_features(model: Any, text: dict[str, Any], mel: int, gen: torch.Generator,
                     ahead: int = 0) -> dict[str, Any]:
    """``text`` with ``input_features`` of as many audio frames as the text has positions after the tower's
    downsampling (a streaming model that adds one audio embedding to each text position and has no audio token:
    Voxtral Realtime, 8 feature frames a token), each layout of :func:`feature_layouts`; ``{}`` where none runs.
    A count is accepted only where ``get_audio_features`` gives one embedding per position (one broadcast embedding
    runs too, and is not the model's input). ``ahead``: positions ``generate`` will add, whose audio the features
    carry too (such a model's generate stops where its audio ends: Voxtral Realtime clamps ``max_length`` to it)."""
    ids = text.get("input_ids")
    features_of = getattr(model, "get_audio_features", None)
    if not isinstance(ids, torch.Tensor) or features_of is None:
        return {}
    batch, seq = ids.shape
    for stride in (1, 2, 4, 8, 16, 32):
        clip = torch.randn(batch, mel, (seq + ahead) * stride, generator=gen)
        for features, whole in zip(feature_layouts(clip[..., :seq * stride].contiguous()), feature_layouts(clip)):
            try:
                with torch.no_grad():
                    out = features_of(input_features=features)
                embeds = getattr(out, "pooler_output", out)
            except Exception:  # noqa: BLE001 - not this layout or length
                continue
            if isinstance(embeds, torch.Tensor) and embeds.dim() == 3 and embeds.shape[:2] == (batch, seq) \
                    and runs(model, {**text, "input_features": features}):
                return {**text, "input_features": whole}
    return {}
