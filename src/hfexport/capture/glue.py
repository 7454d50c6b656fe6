"""The glue between a multimodal model's parts, as its own forward does it: which encoder input comes from which
``generate()`` input, the vision feature fed to the projector, and the token merge (``masked_scatter`` of the
features at a placeholder id).

Shared by capture (:mod:`.multimodal` replays it on the eager parts and requires the model's own ``inputs_embeds``)
and generation (which runs it on the exported parts), so that what capture checks is what generation does.
Encoders whose ``forward`` derives tensors from ``grid_thw`` with data-dependent Python (Qwen2-VL's rotary positions
and packed-sequence offsets) have them recorded at export and derived again by their runner
(:mod:`hfexport.derived`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import UnsupportedError

__all__ = [
    "BEFORE_PROJECTOR",
    "ENCODER_INPUT_ALIASES",
    "IMAGE_INPUTS",
    "derived_image_inputs",
    "encoder_inputs",
    "image_features",
    "image_token_id",
    "placeholder_token_id",
    "glue_for",
    "merge_image_features",
    "refuse_packed_images",
    "select_vision_feature",
]

#: Encoder kwarg -> the generate() input it is fed from, where the names differ.
ENCODER_INPUT_ALIASES = {"hidden_states": "pixel_values", "grid_thw": "image_grid_thw",
                         "merge_sizes": "image_merge_sizes"}


def placeholder_token_id(config: Any, modality: str) -> int:
    """The placeholder id a modality's features replace: ``{modality}_token_id``, or LLaVA's
    ``{modality}_token_index``."""
    names = (f"{modality}_token_id", f"{modality}_token_index")
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    raise UnsupportedError(f"{type(config).__name__} has neither {names[0]} nor {names[1]}")


def image_token_id(config: Any) -> int:
    """The placeholder id the image features replace."""
    return placeholder_token_id(config, "image")


def glue_for(registry: Mapping[str, Any], config: Any, what: str, prompts: str, instead: str) -> Any:
    """The model type's entry in a per-model-type glue registry, or :class:`UnsupportedError` naming the types that
    have one and ``instead`` (what the user can do)."""
    model_type = getattr(config, "model_type", None)
    glue = registry.get(model_type)
    if glue is None:
        raise UnsupportedError(f"generate() merges {what} for {sorted(registry)}; {model_type} {prompts} are not "
                               f"supported yet: {instead}")
    return glue


def _idefics3_image_inputs(config: Any, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """What Idefics3's ``get_image_features`` (SmolVLM's too) makes of ``pixel_values [batch, images, C, H, W]`` and
    ``pixel_attention_mask`` before its vision model: the images of every row in one batch, all-zero padding images
    dropped, and the patch mask (a patch is kept where any of its pixels is)."""
    pixels = inputs.get("pixel_values")
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 5:
        return {}
    flat = pixels.reshape(-1, *pixels.shape[2:])
    real = (flat == 0.0).sum(dim=(-1, -2, -3)) != flat.shape[1:].numel()
    mask = inputs.get("pixel_attention_mask")
    if isinstance(mask, torch.Tensor):
        mask = mask.reshape(-1, *mask.shape[2:])[real].contiguous()
    else:
        mask = torch.ones(int(real.sum()), flat.shape[2], flat.shape[3], dtype=torch.bool)
    patch = config.vision_config.patch_size
    grid = mask.unfold(dimension=1, size=patch, step=patch).unfold(dimension=2, size=patch, step=patch)
    return {"pixel_values": flat[real].contiguous(), "patch_attention_mask": (grid.sum(dim=(-1, -2)) > 0).bool()}


#: model_type -> ``fn(config, inputs)``: the encoder's tensors the model derives from its image inputs in Python
#: before calling the encoder (reshaped, padding images dropped, masks pooled), computed the same way outside the graph.
IMAGE_INPUTS: dict[str, Callable[[Any, Mapping[str, Any]], dict[str, torch.Tensor]]] = {
    "idefics3": _idefics3_image_inputs,
    "smolvlm": _idefics3_image_inputs,
}


def derived_image_inputs(config: Any, inputs: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """The encoder tensors :data:`IMAGE_INPUTS` derives from ``inputs`` for the model type (empty for others)."""
    derive = IMAGE_INPUTS.get(getattr(config, "model_type", None))
    return derive(config, inputs) if derive is not None else {}


def encoder_inputs(config: Any, traced_keys: list[str], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The encoder's tensor kwargs from generate()-style ``inputs`` (``pixel_values``, ``image_grid_thw``, ...),
    plus the tensors :data:`IMAGE_INPUTS` derives for the model type."""
    call: dict[str, Any] = {}
    extra = derived_image_inputs(config, inputs)
    for key in traced_keys:
        source = ENCODER_INPUT_ALIASES.get(key, key)
        if key in extra:
            call[key] = extra[key]
        elif isinstance(inputs.get(source), torch.Tensor):
            call[key] = inputs[source]
    return call


def select_vision_feature(config: Any, output: Any) -> torch.Tensor:
    """What LLaVA-style ``get_image_features`` feeds the projector: a chosen hidden state, CLS token dropped."""
    layer = getattr(config, "vision_feature_layer", None)
    strategy = getattr(config, "vision_feature_select_strategy", None)
    if strategy is None and getattr(config, "vision_feature_layers", None) is not None:  # VipLLaVA's: its layers,
        layer, strategy = config.vision_feature_layers, "default"  # always without the CLS token
    hidden = getattr(output, "hidden_states", None)
    if layer is None or hidden is None:
        features = [output.last_hidden_state if hasattr(output, "last_hidden_state") else output]
    else:
        features = [hidden[i] for i in ([layer] if isinstance(layer, int) else layer)]
    if strategy == "default":
        features = [f[:, 1:] for f in features]
    return features[0] if len(features) == 1 else torch.cat(features, dim=-1)


def _internvl_pixel_shuffle(config: Any, features: torch.Tensor) -> torch.Tensor:
    """InternVL's ``get_image_features`` between the selected feature and the projector: the square patch grid
    pixel-shuffled by ``downsample_ratio`` (``InternVLModel.pixel_shuffle``, weight-free)."""
    from transformers.models.internvl.modeling_internvl import InternVLModel

    from ..derived import ConfigOnly

    batch, side = features.shape[0], int(features.shape[1] ** 0.5)
    grid = features.reshape(batch, side, side, -1)
    shuffled = ConfigOnly(InternVLModel, config).pixel_shuffle(grid, scale_factor=config.downsample_ratio)
    return shuffled.reshape(batch, -1, shuffled.shape[-1])


def _flat_tokens(config: Any, features: torch.Tensor) -> torch.Tensor:
    """Llama 4's forward between its vision model and projector: every image's tokens in one ``[tokens, width]``
    (``image_features.view(-1, image_features.size(-1))``)."""
    return features.reshape(-1, features.shape[-1])


def _one_sequence(config: Any, features: torch.Tensor) -> torch.Tensor:
    """Pixtral's output between its tower and the patch merger (Mistral 3, Mistral Large 4, LightOnOCR): every
    image's patches in one sequence of a batch of one, squeezed (``selected_image_feature.squeeze(0)``)."""
    return features.squeeze(0)


#: model_type -> ``fn(config, features)``: what the model's ``get_image_features`` does to the selected vision
#: feature before its projector, weight-free
BEFORE_PROJECTOR: dict[str, Callable[[Any, torch.Tensor], torch.Tensor]] = {
    "internvl": _internvl_pixel_shuffle,
    "llama4": _flat_tokens,
    "mistral3": _one_sequence,
    "mistral_large4": _one_sequence,
    "lighton_ocr": _one_sequence,
}


def image_features(config: Any, encoder_output: Any, projector: Callable[[torch.Tensor], Any] | None) -> torch.Tensor:
    """The image features as ``[tokens, hidden]``: projected when a projector exists, else the encoder's pooled
    (already merged) output."""
    if projector is not None:
        selected = select_vision_feature(config, encoder_output)
        rearrange = BEFORE_PROJECTOR.get(getattr(config, "model_type", None))
        features = projector(rearrange(config, selected) if rearrange is not None else selected)
    else:
        pooled = getattr(encoder_output, "pooler_output", None)
        features = pooled if pooled is not None else getattr(encoder_output, "last_hidden_state", encoder_output)
    if isinstance(features, list | tuple):
        features = torch.cat([f.reshape(-1, f.shape[-1]) for f in features], dim=0)
    return features.reshape(-1, features.shape[-1])


def merge_image_features(input_ids: torch.Tensor, embeds: torch.Tensor, features: torch.Tensor,
                         token_id: int, what: str = "image") -> torch.Tensor:
    """Scatter ``features`` into ``embeds`` at the placeholder positions (``what``: image, video, audio), as the
    models' own forward does. ``masked_scatter`` fills the positions element after element, so features of another
    width fill them too where their count matches (Inkling's tower gives each image one 1024-wide row for 16 tokens
    of 64)."""
    mask = (input_ids == token_id).unsqueeze(-1).expand_as(embeds)
    n_tokens, n_features = int((input_ids == token_id).sum()), features.shape[0]
    hidden = embeds.shape[-1]
    if features.shape[-1] != hidden and features.numel() == n_tokens * hidden:
        features, n_features = features.reshape(n_tokens, hidden), n_tokens
    if n_tokens != n_features:
        raise UnsupportedError(
            f"the prompt has {n_tokens} {what} tokens (id {token_id}) but the {what} inputs give {n_features} features"
        )
    return embeds.masked_scatter(mask, features.to(embeds.dtype))


def refuse_packed_images(config: Any) -> None:
    """Refuse the images of an any-resolution model (LLaVA-NeXT and its video variant): their ``get_image_features``
    splits each image into tiles and ``pack_image_features`` unpads them to ``image_sizes`` and inserts the
    ``image_newline`` parameter between rows, a layout and a weight no exported part carries."""
    if getattr(config, "image_grid_pinpoints", None) is None:
        return
    raise UnsupportedError(
        f"{getattr(config, 'model_type', type(config).__name__)} images are tiled at any resolution and packed by "
        "pack_image_features (unpadded to image_sizes, image_newline between rows), which hfexport does not reproduce "
        "yet; pass videos (pixel_values_videos), or generate with the eager model"
    )
