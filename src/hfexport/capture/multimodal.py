"""Multimodal models: find the modality encoders, projector, language model and lm_head, and capture each one.

:func:`decompose_multimodal` runs one real forward with a pre-hook on every known submodule and keeps each one's
call kwargs. The glue between them stays in Python (:mod:`.glue`, :mod:`.video`), shared with
:mod:`hfexport.generation.multimodal` so that the capture checks exactly what generation later does: the text
embedding lookup (its own small ``embed_tokens`` graph: the language model is called with ``inputs_embeds``), the
choice of the vision feature fed to the projector, a video's frames through the vision tower, and the token merge
(``masked_scatter`` of the image and video features at their placeholder positions).

Encoders whose ``forward`` derives tensors from ``grid_thw`` with data-dependent Python (Qwen2-VL's and its
successors') are captured as called; their export records those tensors as derived inputs (:mod:`hfexport.derived`).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import UnsupportedError
from ..pytrees import is_cache
from .glue import (
    ENCODER_INPUT_ALIASES,
    derived_image_inputs,
    encoder_inputs,
    image_features,
    image_token_id,
    merge_image_features,
    refuse_packed_images,
)
from .audio import AUDIO_GLUE
from .image_features import audio_features_part, image_features_part
from .recorder import CallRecorder
from .video import video_features, video_token_id

__all__ = [
    "ENCODER_INPUT_ALIASES",
    "MODALITIES",
    "MODALITY_INPUTS",
    "PROJECTOR_NAMES",
    "PROMPT_INPUTS",
    "decompose_multimodal",
    "encoder_inputs",
    "image_features",
    "image_token_id",
    "is_multimodal",
    "merge_image_features",
    "with_modality_inputs",
]

MODALITIES = ("image", "audio")
#: Attribute names a projector is found under (on the model or its base model), in the spec's order.
PROJECTOR_NAMES = ("multi_modal_projector", "connector", "aligner", "embed_vision", "embed_audio", "projector",
                   "vision_projection")
#: generate() inputs the modality encoders are fed from (directly or through the glue)
MODALITY_INPUTS = ("pixel_values", "image_grid_thw", "image_sizes", "input_features", "feature_attention_mask",
                    "input_features_mask", "pixel_values_videos", "video_grid_thw")
#: modality -> the generate() inputs that carry it in a prompt (an image or a video; a clip)
PROMPT_INPUTS = {"image": ("pixel_values", "pixel_values_videos"), "audio": ("input_features", "input_values")}


# --- finding the parts ------------------------------------------------------------------------------------------


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

    Example:
        >>> is_multimodal(TINY_CASES["llava"].build()), is_multimodal(torch.nn.Linear(2, 2))
        (True, False)
    """
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel) or getattr(model.config, "is_encoder_decoder", False):
        return False
    get_decoder = getattr(model, "get_decoder", None)
    if not callable(get_decoder):
        return False
    return any(_encoder_for(model, m) is not None for m in MODALITIES)


def _projectors(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    owners = [model, getattr(model, "model", None), getattr(model, "base_model", None)]
    found: dict[str, torch.nn.Module] = {}
    for name in PROJECTOR_NAMES:
        for owner in owners:
            module = getattr(owner, name, None) if owner is not None else None
            if isinstance(module, torch.nn.Module):
                found[name] = module
                break
    return found


def _submodules(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The known multimodal parts, in the order generation runs them."""
    parts: dict[str, torch.nn.Module] = {}
    for modality in MODALITIES:
        encoder = _encoder_for(model, modality)
        if encoder is not None and all(encoder is not m for m in parts.values()):
            parts[f"{modality}_encoder"] = encoder
    parts.update(_projectors(model))
    get_embeddings = getattr(model, "get_input_embeddings", None)
    embed = get_embeddings() if callable(get_embeddings) else None
    if isinstance(embed, torch.nn.Module):
        parts["embed_tokens"] = embed
    get_decoder = getattr(model, "get_decoder", None)
    decoder = get_decoder() if callable(get_decoder) else None
    if isinstance(decoder, torch.nn.Module) and decoder is not model:
        parts["language_model"] = decoder
    head = getattr(model, "lm_head", None)
    if not isinstance(head, torch.nn.Module) and callable(getattr(model, "get_output_embeddings", None)):
        head = model.get_output_embeddings()
    if isinstance(head, torch.nn.Module):
        parts["lm_head"] = head
    return parts


_SEARCHED = (
    f"get_encoder(modality=...) for {'/'.join(MODALITIES)}, get_decoder(), projector attributes "
    f"{', '.join(PROJECTOR_NAMES)} (on the model and its base model), get_input_embeddings(), lm_head"
)


# --- capture ------------------------------------------------------------------------------------------------------


def with_modality_inputs(model: torch.nn.Module, call: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict:
    """A recorded prefill call made self-contained again: the modality inputs instead of ``mm_encoder_outputs``.

    ``generate()`` runs the encoders before the first ``forward`` (``_prepare_multimodal_encoder_kwargs_for_generation``)
    and hands ``forward`` their outputs, so a forward pre-hook never sees the encoders run. Putting back the
    inputs ``generate`` consumed (``pixel_values``, ``image_grid_thw``, ...) makes ``model(**call)`` run them.
    """
    import inspect

    new = {k: v for k, v in call.items() if k != "mm_encoder_outputs"}
    params = inspect.signature(model.forward).parameters
    for key, value in inputs.items():
        if new.get(key) is None and key in params and value is not None:  # (HunYuan-VL's call passes them as None)
            new[key] = value
    return new




def attribute_snapshot(model: torch.nn.Module) -> list[tuple[torch.nn.Module, dict[str, Any]]]:
    return [(m, {k: v for k, v in vars(m).items() if not k.startswith("_")}) for m in model.modules()]


def restore_attributes(snapshot: list[tuple[torch.nn.Module, dict[str, Any]]]) -> None:
    """Undo state a forward leaves on modules (Qwen2-VL caches ``rope_deltas`` on its base model)."""
    for module, before in snapshot:
        for key in [k for k in vars(module) if not k.startswith("_") and k not in before]:
            delattr(module, key)
        for key, value in before.items():
            if vars(module).get(key) is not value:
                setattr(module, key, value)


def decompose_multimodal(model: torch.nn.Module, inputs: Mapping[str, Any]) -> dict[str, tuple[torch.nn.Module, dict]]:
    """Capture the kwargs of each multimodal submodule during one ``model(**inputs)`` call.

    Args:
        model: A multimodal generative model (``LlavaForConditionalGeneration``, ``Qwen2VLForConditionalGeneration``...).
        inputs: Its forward kwargs for the prefill, including the modality inputs (``pixel_values``...).

    Returns:
        ``{"<modality>_encoder": ..., "<projector attribute>": ..., "embed_tokens": ..., "language_model": ...,
        "lm_head": ...}``, each ``(module, kwargs)``; a projector key only when the model has one under a known
        attribute name (Qwen2-VL's sits inside its vision tower). ``embed_tokens`` is the input embedding lookup:
        the language model is called with ``inputs_embeds``, so the text embeddings need their own graph. The token
        merge (``masked_scatter``) stays outside every graph.

    Where the glue does not reproduce the model's own ``inputs_embeds`` from the tower and projector, the image
    parts are replaced by ``"image_features"``: the model's ``get_image_features`` as one part
    (:mod:`.image_features`), when scattering its output does reproduce them; the audio parts of a model type without
    audio glue by ``"audio_features"`` (its ``get_audio_features``), likewise.

    Raises:
        ValueError: No known multimodal submodule was found, or the forward did not call the encoder.
        UnsupportedError: The merge this module reproduces does not match the model's own, nor does its
            ``get_image_features``' output.

    Example:
        >>> parts = decompose_multimodal(model, processor(images=image, text=prompt, return_tensors="pt"))
        >>> sorted(parts)
        ['embed_tokens', 'image_encoder', 'language_model', 'lm_head', 'multi_modal_projector']
    """
    parts = _submodules(model)
    encoders = [k for k in parts if k.endswith("_encoder")]
    if not encoders or "language_model" not in parts:
        raise ValueError(
            f"no known multimodal submodules found on {type(model).__name__} (found {sorted(parts) or 'none'}); "
            f"searched: {_SEARCHED}"
        )
    call = {k: copy.deepcopy(v) if is_cache(v) else v for k, v in inputs.items()}  # the forward fills caches
    if "mm_encoder_outputs" in call and not any(k in call for k in MODALITY_INPUTS):
        raise ValueError(
            "the prefill kwargs carry precomputed mm_encoder_outputs instead of the modality inputs, so the encoder "
            "would not run; pass them through with_modality_inputs(model, prefill_kwargs, generate_inputs)"
        )
    recorders = {name: CallRecorder(module) for name, module in parts.items()}
    snapshot = attribute_snapshot(model)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(**call)
    finally:
        for recorder in recorders.values():
            recorder.remove()
        restore_attributes(snapshot)
        model.train(was_training)
    silent = [name for name, r in recorders.items() if not r.calls and name != "embed_tokens"]
    called = [name for name in encoders if recorders[name].calls]
    absent = [m for m in MODALITIES if not any(call.get(k) is not None for k in PROMPT_INPUTS[m])]
    if called and absent:  # an image prompt to a model that also hears (Qwen-Omni): the other tower is not exported
        silent = [n for n in silent if n not in {f"{m}_encoder" for m in absent} and n not in PROJECTOR_NAMES]
    if silent:
        raise ValueError(
            f"{type(model).__name__}(**inputs) did not call {silent}; check that the inputs hold what those parts "
            f"take (inputs: {sorted(call)})"
        )
    out: dict[str, tuple[torch.nn.Module, dict]] = {}
    for name, module in parts.items():
        if not recorders[name].calls:
            continue
        out[name] = (module, recorders[name].calls[0])
    if "embed_tokens" not in out:
        ids = call.get("input_ids")
        if ids is None:
            raise ValueError("decompose_multimodal needs input_ids in the inputs to capture the embedding lookup")
        out["embed_tokens"] = (parts["embed_tokens"], {"input": ids})
    try:
        _check_merge(model, call, parts, out, recorders)
    except (UnsupportedError, TypeError, ValueError, RuntimeError, IndexError):
        # the glue does not reproduce this model's parts: its own get_image_features as one part, where that does
        expected = recorders["language_model"].calls[0].get("inputs_embeds")
        whole = image_features_part(model, call, parts["embed_tokens"], expected)
        if whole is None:
            raise
        image_parts = {"image_encoder", *(n for n in PROJECTOR_NAMES if n != "embed_audio")}
        kept = {name: out[name] for name in parts if name in out and name not in image_parts}
        return {"image_features": whole, **kept}
    return _audio_as_one_part(model, call, parts, {name: out[name] for name in parts if name in out}, recorders)


def _audio_as_one_part(model: torch.nn.Module, call: dict, parts: dict, out: dict, recorders: dict) -> dict:
    """``out`` with the audio tower and its projector replaced by ``"audio_features"`` (the model's own
    ``get_audio_features`` as one part, :func:`.image_features.audio_features_part`) for a model type without audio
    glue (:data:`.audio.AUDIO_GLUE`), where scattering its output reproduces the model's ``inputs_embeds``; else
    ``out`` as it is (generation then names the types that have glue)."""
    if "audio_encoder" not in out or getattr(model.config, "model_type", None) in AUDIO_GLUE:
        return out
    expected = recorders["language_model"].calls[0].get("inputs_embeds")
    whole = audio_features_part(model, call, parts["embed_tokens"], expected)
    if whole is None:
        return out
    audio_parts = {"audio_encoder", "embed_audio", "multi_modal_projector"}
    return {"audio_features": whole, **{name: part for name, part in out.items() if name not in audio_parts}}


def _check_merge(model: torch.nn.Module, call: dict, parts: dict, out: dict, recorders: dict) -> None:
    """Replay the glue generation will run, on the eager parts, and require the model's own ``inputs_embeds``."""
    if "image_encoder" not in out:
        return
    config = model.config
    encoder, enc_kwargs = out["image_encoder"]
    images, videos = call.get("pixel_values") is not None, call.get("pixel_values_videos") is not None
    if images:
        refuse_packed_images(config)
        _check_encoder_inputs(config, call, enc_kwargs)
    projector_name = next((n for n in PROJECTOR_NAMES if n in out and n != "embed_audio"), None)
    constants = {k: v for k, v in enc_kwargs.items() if not isinstance(v, torch.Tensor)}
    projector = None
    if projector_name is not None:
        proj_module, proj_kwargs = out[projector_name]
        key = next(iter(proj_kwargs))
        given = {k: call[k] for k in proj_kwargs if k != key and call.get(k) is not None}  # (image_sizes)
        projector = lambda x: proj_module(**{key: x}, **given)  # noqa: E731
    encode = lambda **tensors: encoder(**constants, **tensors)  # noqa: E731
    ids = call["input_ids"]
    with torch.no_grad():
        merged = parts["embed_tokens"](ids)
        if images:
            features = image_features(config, encode(**encoder_inputs(config, list(enc_kwargs), call)), projector)
            merged = merge_image_features(ids, merged, features, image_token_id(config))
        if videos:
            traced = [k for k, v in enc_kwargs.items() if isinstance(v, torch.Tensor)]
            features = video_features(config, encode, traced, projector, call)
            merged = merge_image_features(ids, merged, features, video_token_id(config), "video")
    expected = recorders["language_model"].calls[0].get("inputs_embeds")
    if expected is None or not torch.allclose(merged, expected, rtol=1e-5, atol=1e-6):
        diff = None if expected is None else float((merged - expected).abs().max())
        raise UnsupportedError(
            f"the token merge hfexport reproduces for {type(model).__name__} (vision feature selection, projector, "
            f"masked_scatter at the image / video token ids) differs from the model's own inputs_embeds (max diff "
            f"{diff}); this architecture needs its own glue in hfexport.capture.glue / hfexport.capture.video"
        )


def _check_encoder_inputs(config: Any, call: dict, enc_kwargs: dict) -> None:
    """The image encoder's recorded tensors are the model inputs as they were passed, or what the glue derives from
    them (from the grid, or the model type's own preprocessing: :data:`~.glue.IMAGE_INPUTS`)."""
    remade = derived_image_inputs(config, call)
    for key, value in enc_kwargs.items():
        source = ENCODER_INPUT_ALIASES.get(key, key)
        if not isinstance(value, torch.Tensor):
            continue
        if key in remade:
            if remade[key].shape != value.shape or not torch.equal(remade[key].to(value.dtype), value):
                raise UnsupportedError(f"the image encoder's {key!r} is not what hfexport derives from the model "
                                       f"inputs for {getattr(config, 'model_type', None)} (capture.glue.IMAGE_INPUTS)")
            continue
        if source not in call or not torch.equal(call[source].to(value.dtype), value):
            raise UnsupportedError(f"the image encoder's {key!r} is not the model input {source!r} as it was passed")
