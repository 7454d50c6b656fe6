"""Sample inputs that a forward's parameter names and its config's sizes say how to build, for the models whose
main input is none of the text, image, audio and hidden-state recipes of :mod:`.inputs`.

- ``inputs``, a generic main input name: the encoder's own main input where the model has an encoder that names
  one (a speech encoder-decoder's ``input_values``), else ``input_ids`` (Perceiver's masked LM).
- ``states`` (Decision Transformer): a trajectory of ``states`` / ``actions`` / ``rewards`` / ``returns_to_go``
  ``[B, T, dim]`` at the config's ``state_dim`` and ``act_dim``, its ``timesteps`` and mask.
- ``flattened_patches`` (Pix2Struct): ``[B, patches, 2 + patch width]``, each patch's row and column (from 1) first,
  with the mask of real patches.
- Companions of an input the recipes build: ``visual_feats`` / ``visual_pos`` (LXMERT's region features and
  boxes, at ``visual_feat_dim`` / ``visual_pos_dim``); IDEFICS' one image per row ``[B, 1, C, H, W]`` and the
  ``image_attention_mask`` of every token to it; Kosmos-2's text, with the ``image_embeds_position_mask`` of the
  ``latent_query_num`` positions its image fills after the start token (Kosmos-2.5's image as flattened
  patches); ``prompt_pixel_values`` / ``prompt_masks`` (SegGPT's
  in-context pair, stacked with the image on the height axis, so that each is half the configured height);
  ``noise`` (ViT-MAE's random masking, ``[B, patches]`` uniform, which its forward draws with ``torch.rand`` when
  not given: a program with a random op neither matches eager nor runs everywhere), and UnivNet's ``noise_sequence``
  (``[B, frames, model_in_channels]``, for the same reason); ``classes_structure``
  (OmDet-Turbo's count of class prompts per task, of its flattened ``classes_input_ids``).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["companions", "main_alias", "trajectory_or_patches"]

_REGIONS = 4  # region features per row (LXMERT)
_STEPS = 4  # trajectory steps per row (Decision Transformer)
_GRID = 4  # patches per side (Pix2Struct: a 4 x 4 grid)
_TEXT = 4  # text tokens after Kosmos-2's image positions


def main_alias(model: Any, main: str, params: Any) -> str:
    """The parameter a generic ``main_input_name`` ``inputs`` stands for, else ``main`` itself."""
    if main != "inputs":
        return main
    encoder = getattr(model, "encoder", None)
    name = getattr(encoder, "main_input_name", None)
    if isinstance(name, str) and name != "inputs" and name in params:
        return name
    return "input_ids" if "input_ids" in params or "inputs" in params else main


def trajectory_or_patches(model: Any, main: str, params: Any, gen: torch.Generator,
                          batch: int) -> dict[str, torch.Tensor] | None:
    """The whole input of a model whose main input is a trajectory (``states``) or flattened patches; ``None``
    for any other main input or a config without the sizes it needs."""
    config = model.config
    if main == "states" and isinstance(config_state := getattr(config, "state_dim", None), int):
        act = getattr(config, "act_dim", None)
        if not isinstance(act, int):
            return None
        out = {"states": torch.randn(batch, _STEPS, config_state, generator=gen),
               "actions": torch.randn(batch, _STEPS, act, generator=gen),
               "rewards": torch.randn(batch, _STEPS, 1, generator=gen),
               "returns_to_go": torch.randn(batch, _STEPS, 1, generator=gen),
               "timesteps": torch.arange(_STEPS).repeat(batch, 1)}
        if "attention_mask" in params:
            out["attention_mask"] = torch.ones(batch, _STEPS, dtype=torch.long)
        return {k: v for k, v in out.items() if k in params}
    vision = getattr(config, "vision_config", None) or config
    width = getattr(vision, "patch_embed_hidden_size", None)
    if main == "flattened_patches" and isinstance(width, int):
        index = torch.arange(_GRID * _GRID)
        patches = torch.randn(batch, _GRID * _GRID, 2 + width, generator=gen)
        patches[..., 0], patches[..., 1] = index // _GRID + 1, index % _GRID + 1
        out = {"flattened_patches": patches}
        if "attention_mask" in params:
            out["attention_mask"] = torch.ones(batch, _GRID * _GRID, dtype=torch.long)
        return out
    return None


def companions(model: Any, out: dict[str, Any], params: Any, gen: torch.Generator) -> dict[str, Any]:
    """``out`` with the inputs that go with the ones it has, by their names (see the module's docstring)."""
    config = model.config
    ids, pixels = out.get("input_ids"), out.get("pixel_values")
    feat, pos = getattr(config, "visual_feat_dim", None), getattr(config, "visual_pos_dim", None)
    if isinstance(ids, torch.Tensor) and "visual_feats" in params and isinstance(feat, int) and isinstance(pos, int):
        batch = ids.shape[0]
        out = {**out, "visual_feats": torch.randn(batch, _REGIONS, feat, generator=gen),
               "visual_pos": torch.rand(batch, _REGIONS, pos, generator=gen)}
    vision = getattr(config, "vision_config", None)
    side = getattr(vision, "image_size", None)
    if isinstance(ids, torch.Tensor) and "image_attention_mask" in params and "perceiver_embeddings" in params \
            and pixels is None and isinstance(side, int):  # IDEFICS: one image per row, every token attends to it
        batch, seq = ids.shape
        out = {**out, "pixel_values": torch.randn(batch, 1, 3, side, side, generator=gen),
               "image_attention_mask": torch.ones(batch, seq, 1, dtype=torch.long)}
    latents = getattr(config, "latent_query_num", None)
    if isinstance(ids, torch.Tensor) and pixels is None and "flattened_patches" in params and isinstance(latents, int):
        pixels = trajectory_or_patches(model, "flattened_patches", params, gen, ids.shape[0])  # Kosmos-2.5's image:
        out = {**out, **(pixels or {})}  # flattened patches (Pix2Struct's), placed as Kosmos-2's below
        pixels = (pixels or {}).get("flattened_patches")
    if isinstance(pixels, torch.Tensor) and "image_embeds_position_mask" in params and isinstance(latents, int):
        batch = pixels.shape[0]  # Kosmos-2: a start token, the image's latent positions, then the text
        ids = torch.randint(3, 100, (batch, latents + _TEXT), generator=gen)
        where = torch.zeros_like(ids)
        where[:, 1: latents + 1] = 1
        out = {**out, "input_ids": ids, "attention_mask": torch.ones_like(ids), "image_embeds_position_mask": where}
    size = getattr(config, "image_size", None)
    if isinstance(pixels, torch.Tensor) and "prompt_pixel_values" in params and isinstance(size, (list, tuple)):
        shape = (pixels.shape[0], pixels.shape[1], size[0] // 2, size[1])
        out = {**out, **{name: torch.randn(*shape, generator=gen)
                         for name in ("pixel_values", "prompt_pixel_values", "prompt_masks") if name in params}}
    classes = out.get("classes_input_ids")
    if isinstance(classes, torch.Tensor) and "classes_structure" in params and isinstance(pixels, torch.Tensor):
        per_task = max(1, classes.shape[0] // pixels.shape[0])  # OmDet-Turbo: how many of the flattened class
        out = {**out, "classes_structure": torch.full((pixels.shape[0],), per_task)}  # prompts each image's task has
    patch, ratio = getattr(config, "patch_size", None), getattr(config, "mask_ratio", None)
    if isinstance(pixels, torch.Tensor) and "noise" in params and isinstance(patch, int) and ratio is not None:
        patches = (pixels.shape[-2] // patch) * (pixels.shape[-1] // patch)
        out = {**out, "noise": torch.rand(pixels.shape[0], patches, generator=gen)}
    features, channels = out.get("input_features"), getattr(config, "model_in_channels", None)
    if isinstance(features, torch.Tensor) and features.dim() == 3 and "noise_sequence" in params \
            and isinstance(channels, int):  # UnivNet: [B, frames, model_in_channels], drawn by randn when not given
        out = {**out, "noise_sequence": torch.randn(*features.shape[:2], channels, generator=gen)}
    return out
