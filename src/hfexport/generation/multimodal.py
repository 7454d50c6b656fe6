"""``ExportedModel.generate`` for image-text-to-text exports: encoders, token merge, prefill, decode loop.

The prefill is assembled from the exported parts the way the model's own forward assembles it: the text embeddings
from ``embed_tokens``, the image features from the image encoder (and projector) scattered over the image tokens,
then ``language_model`` and ``lm_head`` on the last position. The decode steps run the ``decode`` graph (the whole
model on one new token and the cache). Positions follow ``generate()``: from the attention mask, or for M-RoPE
models (Qwen2-VL) the model class's own ``get_rope_index`` (no weights involved) with the text positions as the
first row; each step then adds one to the last position, as ``_update_model_kwargs_for_generation`` does
(PaliGemma's positions start at 1: :data:`POSITION_OFFSET`). A language model traced with a prepared 4D mask gets,
where the prompt carries token types, the model class's own ``create_masks_for_generate`` masks: its bidirectional
blocks (PaliGemma's prompt prefix, Gemma3's images) are the model's rule, not a causal one.
"""

from __future__ import annotations

import copy
import importlib
import inspect
from typing import Any

import torch

from ..capture.audio import merge_audio
from ..capture.glue import encoder_inputs, image_features, image_token_id, merge_image_features, placeholder_token_id, \
    refuse_packed_images
from ..capture.multimodal import MODALITIES, PROJECTOR_NAMES, PROMPT_INPUTS
from ..capture.video import video_features, video_token_id
from ..derived import ConfigOnly
from ..errors import UnsupportedError
from ..metadata import KwargKind
from .loop import Component, TextState, decode_loop

__all__ = ["generate_multimodal", "POSITION_OFFSET"]

# (and an lm_head where the language model returns hidden states: one that is a ForCausalLM has its own head)
_NEEDED = ("embed_tokens", "language_model", "decode")
_TOKEN_TYPES = ("token_type_ids", "mm_token_type_ids")
#: model_type -> what the class's ``prepare_inputs_for_generation`` adds to the mask-derived position ids
#: (``PaliGemmaForConditionalGeneration``: "position_ids in Paligemma are 1-indexed").
POSITION_OFFSET = {"paligemma": 1}


def generate_multimodal(exported: Any, plan: Any, inputs: dict) -> Any:
    """Greedy/sampled generation over the components of a multimodal ``export_for_generation``.

    Args:
        exported: The :class:`~hfexport.ExportedModel`.
        plan: The call's :class:`~hfexport.generation.plan.GenerationPlan`.
        inputs: The processor's output: ``input_ids``, ``attention_mask``, ``pixel_values`` and what the model
            takes with them (``image_grid_thw``, ``mm_token_type_ids``...).

    Returns:
        The prompt followed by the new tokens, as ``model.generate`` returns them.
    """
    missing = [n for n in _NEEDED if n not in exported.components]
    if missing:
        raise UnsupportedError(
            f"this multimodal export lacks {missing} (components: {list(exported.components)}); re-export it with "
            "export_for_generation"
        )
    config = exported.config
    if config is None:
        raise UnsupportedError("generate() of a multimodal export needs its config (config.json next to the export)")
    parts = {name: Component(exported, name) for name in exported.components}
    lm, head, decode = parts["language_model"], parts.get("lm_head"), parts["decode"]

    input_ids = inputs.pop("input_ids")
    batch, prompt_len = input_ids.shape
    mask2d = inputs.pop("attention_mask", None)
    mask2d = torch.ones_like(input_ids) if mask2d is None else mask2d.long()
    embeds = _run(parts["embed_tokens"], {_only_key(parts["embed_tokens"]): input_ids})
    deepstack: dict[str, Any] = {}  # (Qwen3-VL's vision features added again at early layers)
    embeds = _merge_modalities(config, parts, input_ids, embeds, inputs, deepstack)
    positions = _prefill_positions(exported, lm, input_ids, mask2d, inputs)
    positions = positions + POSITION_OFFSET.get(getattr(config, "model_type", None), 0)
    window = getattr(_text_config(config), "sliding_window", None)
    text = TextState(mask2d, plan.gen.max_new_tokens, decode.cache_capacity(), window, positions=positions)

    call = text.kwargs(lm, 0, prompt_len, lm.initial_cache(batch, input_ids.device))
    _use_model_masks(exported, lm, call, embeds, mask2d, inputs)
    lm_out = lm.runner(inputs_embeds=embeds, **call, **deepstack)
    if hasattr(lm_out, "logits") and not hasattr(lm_out, "last_hidden_state"):
        logits = lm_out.logits[:, -1:, :]  # a language model with its own head (Llama 4's is a ForCausalLM)
    else:
        hidden = lm_out.last_hidden_state if hasattr(lm_out, "last_hidden_state") else lm_out[0]
        if head is None:
            raise UnsupportedError(
                f"this multimodal export's language model returns hidden states and the export has no lm_head "
                f"(components: {list(exported.components)}); re-export it with export_for_generation")
        logits = _run(head, {_only_key(head): hidden[:, -1:, :]})
    # token types the decode graph reads (Gemma3's are a constant None after the prompt)
    type_ids = {k: inputs.get(k) for k in _TOKEN_TYPES if decode.metadata.kind_of(k) is KwargKind.TENSOR}
    # prompt inputs generate() passes at every step, which the decode graph was traced with (Qwen2-Audio's
    # feature_attention_mask: its forward moves it to the device before it sees that the step has no audio; Molmo 2's
    # image_num_crops) (a modality input the decode graph saw as None, HunYuan-VL's grid, is a constant there: not
    # passed; token types grow per step, below)
    passed = {k: v for k, v in inputs.items()
              if k not in _TOKEN_TYPES and decode.metadata.kind_of(k) is KwargKind.TENSOR}
    state = {"cache": getattr(lm_out, lm.cache_key) if lm.cache_key else None}

    def step(token: torch.Tensor) -> torch.Tensor:
        call = text.kwargs(decode, text.advance(), 1, state["cache"])
        call.update({k: v for k, v in passed.items() if k not in call})
        call["input_ids"] = token[:, None]
        for key, value in type_ids.items():
            # generate() grows mm_token_type_ids with zeros (text) and token_type_ids with their last value
            last = key == "token_type_ids" and value is not None
            call[key] = value[:, -1:] if last else torch.zeros(batch, 1, dtype=torch.long, device=token.device)
        out = decode.runner(**call)
        state["cache"] = getattr(out, decode.cache_key) if decode.cache_key else None
        return out.logits

    return decode_loop(plan, input_ids, logits, step)


def _use_model_masks(exported: Any, lm: Component, call: dict, embeds: torch.Tensor, mask2d: torch.Tensor,
                     inputs: dict) -> None:
    """Put the model class's own prefill masks into ``call`` where the language model takes prepared 4D masks and
    the prompt carries token types (``call`` holds causal-and-padding ones; a static cache's extra slots stay
    masked)."""
    token_types = {k: inputs[k] for k in _TOKEN_TYPES if inputs.get(k) is not None}
    if lm.mask_kind() not in ("4d", "dict") or not token_types:
        return
    cls = _model_class(exported)
    make = getattr(cls, "create_masks_for_generate", None)
    if make is None:
        raise UnsupportedError(
            f"{getattr(cls, '__name__', cls)}'s language model takes a prepared 4D attention mask and the prompt has "
            f"{sorted(token_types)}, but the class has no create_masks_for_generate to build it from them; pass "
            "the prompt without token types if the model attends causally"
        )
    config = copy.deepcopy(exported.config)
    config._attn_implementation = "sdpa"  # boolean masks, as the traced graph takes them
    with torch.no_grad():
        masks = make(config=config, inputs_embeds=embeds, attention_mask=mask2d, past_key_values=None,
                     position_ids=None, is_first_iteration=True, **token_types)
    current = call["attention_mask"]
    if isinstance(current, dict):
        call["attention_mask"] = {k: _fit_mask(masks.get(k) if isinstance(masks, dict) else masks, v)
                                  for k, v in current.items()}
    else:
        full = masks.get("full_attention") if isinstance(masks, dict) else masks
        call["attention_mask"] = _fit_mask(full, current)


def _fit_mask(mask: torch.Tensor | None, current: torch.Tensor) -> torch.Tensor:
    """``mask`` over the prompt's positions, widened to ``current``'s slots (a static cache); ``current`` where the
    model's mask is ``None`` (plain causal: sdpa's ``is_causal``)."""
    if not isinstance(mask, torch.Tensor):
        return current
    mask = mask.to(current.dtype).expand(current.shape[0], -1, -1, -1)
    extra = current.shape[-1] - mask.shape[-1]
    return torch.nn.functional.pad(mask, (0, extra), value=False) if extra > 0 else mask


def _model_class(exported: Any) -> type | None:
    import transformers

    return getattr(transformers, exported.components["decode"].metadata.architecture or "", None)


def _text_config(config: Any) -> Any:
    get = getattr(config, "get_text_config", None)
    return get() if callable(get) else config


def _only_key(component: Component) -> str:
    keys = [k for k, v in component.kwargs.items() if v.fed]
    if len(keys) != 1:
        raise UnsupportedError(f"the {component.name} graph takes {keys}; expected a single tensor input")
    return keys[0]


def _run(component: Component, call: dict) -> Any:
    out = component.runner(**call)
    return out[0] if isinstance(out, list | tuple) else out


def _merge_modalities(config: Any, parts: dict, input_ids: torch.Tensor, embeds: torch.Tensor, inputs: dict,
                      deepstack: dict) -> Any:
    whole = parts.get("image_features")  # the model's get_image_features as one part (capture.image_features)
    if whole is not None:
        derived = {k for d in whole.metadata.derived_inputs for k in d.names}  # (its runner derives them)
        traced = [k for k, v in whole.kwargs.items() if v.fed and k not in derived]
        call = {k: inputs[k] for k in traced if inputs.get(k) is not None}
        if call:
            absent = [k for k in traced if k not in call]
            if absent:
                raise UnsupportedError(f"the image features part needs {absent}; pass them with pixel_values")
            if inputs.get("pixel_values_videos") is not None:
                raise UnsupportedError(f"{getattr(config, 'model_type', None)} is exported with its own "
                                       "get_image_features for images; videos are not supported yet: generate with "
                                       "the eager model")
            out = whole.runner(**call)
            features, tapped = (out[0], list(out[1:])) if isinstance(out, list | tuple) else (out, [])
            embeds = merge_image_features(input_ids, embeds, features, image_token_id(config))
            if "deepstack_visual_embeds" in parts["language_model"].kwargs:  # (Granite Docling; [] when none tapped)
                deepstack["visual_pos_masks"] = input_ids == image_token_id(config)
                deepstack["deepstack_visual_embeds"] = tapped
    heard = parts.get("audio_features")  # the model's get_audio_features as one part (capture.image_features)
    if heard is not None and inputs.get("input_features") is not None:
        call = {k: input_ids if k == "input_ids" else inputs.get(k) for k, v in heard.kwargs.items() if v.fed}
        absent = [k for k, v in call.items() if v is None]  # (Music Flamingo's takes input_ids: its audio tokens)
        if absent:
            raise UnsupportedError(f"the audio features part needs {absent}; pass them with input_features")
        features = _run(heard, call)
        embeds = merge_image_features(input_ids, embeds, features, placeholder_token_id(config, "audio"), "audio")
    for modality in MODALITIES:
        encoder = parts.get(f"{modality}_encoder")
        if encoder is None:
            given = [k for k in PROMPT_INPUTS[modality] if inputs.get(k) is not None]
            one_part = whole if modality == "image" else heard  # (the model's own get_*_features as one part)
            if given and one_part is None:
                raise UnsupportedError(
                    f"this export has no {modality} encoder (components: {sorted(parts)}): it was captured with a "
                    f"prompt without {modality}, so {given} cannot be merged; re-export with a {modality} prompt"
                )
            continue
        if modality == "audio":
            embeds = merge_audio(config, encoder, _projector(parts, "audio", inputs), input_ids, embeds, inputs)
            continue
        traced = [k for k, v in encoder.kwargs.items() if v.fed]
        call = encoder_inputs(config, traced, inputs)
        if not call:
            continue  # a text-only prompt: nothing to merge
        refuse_packed_images(config)
        derived = {k for d in encoder.metadata.derived_inputs if d.source in call for k in d.names}  # (its runner's)
        absent = [k for k in traced if k not in call and k not in derived]
        if absent:
            raise UnsupportedError(f"the image encoder needs {absent}; pass them with pixel_values")
        out = encoder.runner(**call)
        features = image_features(config, out, _projector(parts, "image", inputs))
        embeds = merge_image_features(input_ids, embeds, features, image_token_id(config))
        if parts["language_model"].takes("deepstack_visual_embeds"):
            _deepstack(config, out, input_ids, inputs, deepstack)
    return _merge_video(config, parts, input_ids, embeds, inputs)


def _deepstack(config: Any, out: Any, input_ids: torch.Tensor, inputs: dict, deepstack: dict) -> None:
    """What Qwen3-VL's forward hands its language model beside the merged embeddings for an image prompt: the image
    tokens' mask and the tower's deepstack features (each ``[image tokens, hidden]``, added at the early layers)."""
    if inputs.get("pixel_values_videos") is not None:
        raise UnsupportedError(
            f"{getattr(config, 'model_type', None)} adds deepstack features of both images and videos to its early "
            "layers; a prompt with both is not supported yet: generate with the eager model, or one modality a prompt"
        )
    features = getattr(out, "deepstack_features", None)
    if not isinstance(features, list | tuple):
        raise UnsupportedError("the language model takes deepstack_visual_embeds, but the exported vision tower "
                               "returns no deepstack_features")
    deepstack["visual_pos_masks"] = input_ids == image_token_id(config)
    deepstack["deepstack_visual_embeds"] = list(features)


def _projector(parts: dict, modality: str, inputs: dict | None = None) -> Any:
    """The projector of ``modality``'s features as a callable, ``None`` when the export has none. A projector that
    also takes a generate() input (Mistral 3's patch merger: ``image_sizes``) gets it from ``inputs``."""
    names = [n for n in PROJECTOR_NAMES if n in parts]
    if modality == "audio":
        names = [n for n in names if n in ("embed_audio", "multi_modal_projector")]
    else:
        names = [n for n in names if n != "embed_audio"]
    if not names:
        return None
    component = parts[names[0]]
    extra = {k: inputs[k] for k, v in component.kwargs.items() if v.fed and inputs and inputs.get(k) is not None}
    features = [k for k, v in component.kwargs.items() if v.fed and k not in extra]
    if len(features) != 1:
        raise UnsupportedError(f"the {component.name} graph takes {features} beside the generate() inputs "
                               f"{sorted(extra)}; expected a single tensor of features")
    return lambda x, c=component, k=features[0]: _run(c, {k: x, **extra})


def _merge_video(config: Any, parts: dict, input_ids: torch.Tensor, embeds: torch.Tensor, inputs: dict) -> Any:
    """Video frames through the exported vision tower with the model's own video glue
    (:data:`~hfexport.capture.video.VIDEO_GLUE`), scattered over the video tokens."""
    if inputs.get("pixel_values_videos") is None:
        return embeds
    encoder = parts.get("image_encoder")
    if encoder is None:
        raise UnsupportedError(
            f"this export has no vision tower for the video (components: {sorted(parts)}); "
            f"{getattr(config, 'model_type', None)} videos are not supported yet: generate with the eager model"
        )
    derived = {k for d in encoder.metadata.derived_inputs for k in d.names}  # (its runner derives them)
    traced = [k for k, v in encoder.kwargs.items() if v.fed and k not in derived]
    features = video_features(config, encoder.runner, traced, _projector(parts, "image", inputs), inputs)
    return merge_image_features(input_ids, embeds, features, video_token_id(config), "video")


def _prefill_positions(exported: Any, lm: Component, input_ids: torch.Tensor, mask2d: torch.Tensor,
                       inputs: dict) -> torch.Tensor:
    """The prompt's position ids as ``generate()`` builds them: ``[b, s]``, or ``[4, b, s]`` for M-RoPE."""
    text = (mask2d.long().cumsum(-1) - 1).masked_fill(mask2d == 0, 0)
    spec = lm.metadata.input_spec("position_ids")
    shape = (spec.example_shape or spec.shape) if spec is not None else []
    embeds = lm.metadata.input_spec("inputs_embeds")
    traced_batch = (embeds.example_shape or embeds.shape)[0] if embeds is not None else None
    if len(shape) == 2 and shape[0] == 1 and isinstance(traced_batch, int) and traced_batch > 1:
        # one row of positions for a batch: the model's generate passes none and it counts over the padded prompt
        # (Exaone-4.5: arange(seq)[None]), which is what it was traced with
        return torch.arange(input_ids.shape[1], device=input_ids.device)[None]
    if len(shape) != 3:
        return text
    grids = {k: inputs.get(k) for k in ("image_grid_thw", "video_grid_thw")}
    if any(g is not None for g in grids.values()):
        base = _rope_owner(exported)
        types = {}
        # (Qwen2.5-Omni's finds the media by their token ids: it takes no token types)
        if "mm_token_type_ids" in inspect.signature(base.get_rope_index).parameters:
            types["mm_token_type_ids"] = inputs.get("mm_token_type_ids")
            if types["mm_token_type_ids"] is None:
                raise UnsupportedError(
                    "image_grid_thw was passed without mm_token_type_ids; the processor returns both, and the 3D "
                    "(M-RoPE) positions need them (the model itself refuses this input)"
                )
        vision, _ = base.get_rope_index(input_ids, attention_mask=mask2d, **types, **grids)
    else:
        vision = text.unsqueeze(0).expand(3, -1, -1)
    # a 4-row layout carries the text positions first (for the mask), then the three M-RoPE axes
    return torch.cat([text[None], vision], dim=0) if int(shape[0]) == 4 else vision


def _rope_owner(exported: Any) -> ConfigOnly:
    architecture = exported.components["decode"].metadata.architecture
    cls = _model_class(exported)
    module = importlib.import_module(cls.__module__) if cls is not None else None
    owners = [c for c in vars(module).values() if isinstance(c, type) and "get_rope_index" in vars(c)] if module else []
    if not owners:
        raise UnsupportedError(
            f"{architecture} takes 3D (M-RoPE) position ids but no get_rope_index was found next to it in transformers"
        )
    return ConfigOnly(owners[0], exported.config)
