"""Seeded sample inputs for a tiny model, chosen by its ``main_input_name`` and its forward signature.

Text: ``input_ids`` ``[2, seq]`` with row 0 left-padded by two positions and its ``attention_mask``; encoder-decoder
models also get ``decoder_input_ids`` starting with their decoder start token (not for generation, which starts the
decoder itself). Images: ``pixel_values`` ``[2, channels, size, size]`` at the config's image size. Audio:
``input_features`` ``[2, mel_bins, 2 * max_source_positions]`` (Whisper layout) or ``[2, frames, features]``, and raw
``input_values`` ``[2, 1600]``; audio-text-to-text models get one clip per row and its audio tokens (the count
``get_audio_features`` gives, else the one the forward accepts). Image-text-to-text models get one image per row with
as many image tokens as their vision tower makes features (wrapped in the family's image start and end tokens where it
has them, with the processor's ``mm_token_type_ids`` where the forward takes them: :mod:`.prompts`), where its
``get_image_features`` takes pixels (with their sizes, a second tower's pixels, a pixel mask), flattened patches and
a ``grid_thw`` (Qwen-VL-like) or NaFlex patches, and an image-token id is all they need (else text only); families
with a hand-written tiny case (:data:`hfexport.tools.matrix.shrink.FROM_TINY_CASES`) use its inputs. Vision towers that
take patches and a ``grid_thw``, videos, mono audio and transposed features: :mod:`.media` tries the other layouts of a
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
from .media import FEATURE_SIZES, GRID_KEYS, MEL_BINS, audio_layouts, config_value, feature_layouts, feature_masks, \
    first_that_runs, grid_candidates, image_layouts, image_sides, packed_candidates, patch_candidates, \
    sample_features, sample_pixels, variants
from .prompts import with_audio, with_image
from .series import series_inputs
from .shrink import FROM_TINY_CASES

__all__ = ["NoInputRecipe", "sample_inputs"]

_PAD, _FIRST_ID, _LAST_ID = 0, 3, 248
_FEATURE_KEYS = ("input_features", "audio_mel")  # (Gemma 3n's audio tower names its log-mel features audio_mel)


class NoInputRecipe(Exception):
    """The matrix has no sample-input recipe for this model's main input."""


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


def _audio(gen: torch.Generator, batch: int) -> torch.Tensor:
    return torch.randn(batch, 1600, generator=gen)


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


def sample_inputs(model: Any, model_type: str, batch: int = 2, seq: int = 6,
                  for_generation: bool = False, new_tokens: int = 0) -> dict[str, torch.Tensor]:
    """Forward (or ``generate``) kwargs for ``model``, seeded by ``(batch, seq)``; ``new_tokens``: the tokens a
    ``generate`` on them will add, which a streaming model's audio (one embedding a position) must cover too.

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
        side = sample_pixels(model, gen, batch).shape[-1]
        return first_that_runs(model, patch_candidates(config, gen, batch, side, params))
    if main == "pixel_values" and "target_sizes" in params and "input_ids" not in params:  # a MiniCPM-V-like tower
        return first_that_runs(model, packed_candidates(model.config, gen, batch))
    if main == "input_ids":
        out: dict[str, torch.Tensor] = _text(model, gen, batch, seq, params)
    elif main in ("pixel_values", "pixel_values_videos"):
        out = {main: sample_pixels(model, gen, batch)}
    elif main in _FEATURE_KEYS:
        out = {main: sample_features(model, gen, batch)}
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
        out.update(with_image(model, gen, batch, out))
    elif main == "input_ids" and "input_features" in params and model.can_generate():  # audio-text-to-text
        out.update(with_audio(model, gen, batch, out, new_tokens))
    elif main == "input_ids" and "input_features" in params and not model.can_generate() \
            and _tower(model.config, "audio"):
        out["input_features"] = sample_features(model, gen, batch)  # CLAP: text and audio
    elif main == "input_ids" and "pixel_values" in params and not model.can_generate() \
            and _tower(model.config, "vision"):
        # CLIP-like dual encoders
        # (or an encoder over text with image tokens: ModernVBERT)
        out.update(with_image(model, gen, batch, out) or {"pixel_values": sample_pixels(model, gen, batch)})
    elif main in ("pixel_values", "pixel_values_videos") and "input_ids" in params and not model.can_generate():
        out.update(_text(model, gen, batch, seq, params))
    # an image-first class whose text is optional (BLIP, Kosmos-2) or required (BLIP-2): tried with it below
    text_too = main in ("pixel_values", "pixel_values_videos") and "input_ids" in params and "input_ids" not in out
    for name in required:  # media a text-first class also requires (PE Audio: input_ids and input_values; PE
        if name not in out and name in ("pixel_values", "pixel_values_videos", "input_values"):  # Video: a video)
            out[name] = _audio(gen, batch) if name == "input_values" else sample_pixels(model, gen, batch)
        elif name not in out and name in _FEATURE_KEYS:  # a codec's semantic branch (X-Codec 2: waveform + mel)
            out[name] = sample_features(model, gen, batch)
        elif name not in out and name.endswith("input_ids") and not (text_too and name == "input_ids"):
            out.update(_named_text(model, gen, batch, seq, params, name[: -len("input_ids")]))  # InstructBLIP's
    if main == "input_values" and "pixel_values_videos" in params and "pixel_values_videos" not in out:
        # an audio-video encoder: both streams, each optional in its signature (PE Audio-Video's; its layouts below
        out["pixel_values_videos"] = sample_pixels(model, gen, batch)  # make it a video)
    out = companions(model, out, params, gen)  # (LXMERT's region features, SegGPT's prompt pair)
    if hidden := [n for n in required if n not in out and _is_hidden_like(n)]:  # BLIP-2 Q-Former's query_embeds
        out = first_that_runs(model, _hidden_states(model, gen, batch, seq, hidden, out, params))
    if getattr(model.config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
        out["decoder_input_ids"] = _decoder_ids(model, gen, batch, seq)
    if "lang_ids" in params and isinstance(out.get("input_ids"), torch.Tensor):  # X-MOD's adapters: language 0
        out["lang_ids"] = torch.zeros(out["input_ids"].shape[0], dtype=torch.long)
    if "bbox" in params and isinstance(out.get("input_ids"), torch.Tensor):  # a layout model: a box per token
        out = first_that_runs(model, _with_boxes(out, gen))
    frames = config_value(model.config, "num_frames", "frames_per_clip") or 2
    pixels = out.get("pixel_values")
    sides = image_sides(pixels.shape[-1]) if isinstance(pixels, torch.Tensor) and pixels.dim() == 4 else []
    layouts = {"pixel_values": image_layouts(frames, sides), "pixel_values_videos": image_layouts(frames),
               "input_values": audio_layouts, **dict.fromkeys(_FEATURE_KEYS, feature_layouts)}
    if main == "input_values" and isinstance(mel_bins := config_value(model.config, "num_mel_bins"), int):
        # a spectrogram under the raw-audio name (AST): [B, max_length frames, mel bins] after the raw layouts
        frames = config_value(model.config, "max_length")
        frames = frames if isinstance(frames, int) and 0 < frames <= 4096 else 32
        spectrogram = torch.randn(batch, frames, mel_bins, generator=gen)
        layouts["input_values"] = lambda v: chain(audio_layouts(v), feature_layouts(spectrogram))
    ratios = config_value(model.config, "downsampling_ratios", "upsampling_ratios")
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
    codebooks = config_value(model.config, "num_codebooks")
    if main == "input_ids" and isinstance(codebooks, int) and codebooks > 1:  # MusicGen's rows: one per codebook
        layouts["input_ids"] = lambda ids: iter((ids, ids.repeat_interleave(codebooks, dim=0)))
    feature_key = main if main in _FEATURE_KEYS else "input_features"
    mel = config_value(model.config, "num_mel_bins")
    # every mask of the features the forward takes, optional ones too: Audio Flamingo 3's encoder sums its
    # input_features_mask, None by default
    masks = feature_masks(list(params), mel or config_value(model.config, *FEATURE_SIZES), feature_key)
    if main in _FEATURE_KEYS and not config_value(model.config, *FEATURE_SIZES):  # no size named: 80 bins too
        layouts[main] = lambda f: chain(feature_layouts(f), feature_layouts(f[..., : MEL_BINS[1]].contiguous()))
    with_text = None
    if text_too:  # with image placeholders where the model takes them (BLIP-2's query tokens), else plain text
        text = _text(model, gen, batch, seq, params)
        with_text = {**out, **text, **with_image(model, gen, batch, text, out)}
    # the aliased main input may be hidden states after all (VibeVoice's acoustic decoder: latents)
    states = _hidden_states(model, gen, batch, seq, [alias], out, params) if alias and _is_hidden_like(alias) else ()
    out = first_that_runs(model, chain(variants(out, layouts, masks),
                                       variants(with_text, layouts, masks) if with_text else (), states))
    return {k: v for k, v in out.items() if not (for_generation and k == "decoder_input_ids")}
