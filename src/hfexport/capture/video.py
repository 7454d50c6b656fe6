"""Video prompts: each model type's ``get_video_features`` around its vision tower, as data (:data:`VIDEO_GLUE`).

Shared by capture (which replays it on the eager parts against the model's own ``inputs_embeds``) and generation
(which runs it on the exported parts); the features are then scattered over the prompt's video tokens.

- Qwen2-VL: the vision tower takes a video's temporal patches as an image's, with the video's grid
  (``Qwen2VLModel.get_video_features``).
- LLaVA-NeXT-Video: every frame through the vision tower as an image, the configured hidden state (CLS dropped for
  the ``default`` strategy), the weight-free spatial pooling of ``LlavaNextVideoPooler`` (average or max), then the
  projector; all frames of all videos in order (``LlavaNextVideoModel.get_video_features``, transformers 5.x).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..errors import UnsupportedError
from .glue import encoder_inputs, glue_for, image_features, placeholder_token_id, select_vision_feature

__all__ = ["VIDEO_GLUE", "video_features", "video_token_id"]

#: ``fn(config, encode, traced_keys, project, inputs)`` -> ``[video tokens, hidden]``; ``encode(**tensors)`` runs
#: the vision tower (exported or eager), ``project`` the projector (``None`` where the model has none)
VideoGlue = Callable[[Any, Callable[..., Any], list, Callable | None, Mapping[str, Any]], torch.Tensor]


def video_token_id(config: Any) -> int:
    """The placeholder id the video features replace."""
    return placeholder_token_id(config, "video")


def _qwen2_vl(config: Any, encode: Callable[..., Any], traced: list, project: Callable | None,
              inputs: Mapping[str, Any]) -> torch.Tensor:
    call = encoder_inputs(config, traced, {"pixel_values": inputs["pixel_values_videos"],
                                           "image_grid_thw": inputs.get("video_grid_thw")})
    absent = [k for k in traced if k not in call]
    if absent:
        raise UnsupportedError(f"the vision encoder needs {absent} for the video; pass video_grid_thw with it")
    return image_features(config, encode(**call), project)


def _spatial_pool(config: Any, features: torch.Tensor) -> torch.Tensor:
    """``LlavaNextVideoPooler.forward`` for its weight-free modes: the frame's square grid of patches pooled with
    ``spatial_pool_stride``."""
    mode, stride = getattr(config, "spatial_pool_mode", "average"), int(getattr(config, "spatial_pool_stride", 2))
    if mode not in ("average", "max"):
        raise UnsupportedError(
            f"{config.model_type} pools video frames with spatial_pool_mode={mode!r}, a convolution whose weights "
            "(vision_resampler) no exported part carries; hfexport merges 'average' and 'max' pooled videos "
            "(the released checkpoints' 'average'): generate this model's videos with the eager model"
        )
    frames, patches, dim = features.shape
    side = int(math.sqrt(patches))
    grid = features.view(frames, side, side, dim).permute(0, 3, 1, 2)
    pool = torch.nn.functional.avg_pool2d if mode == "average" else torch.nn.functional.max_pool2d
    return pool(grid, kernel_size=stride, stride=stride).flatten(2).transpose(1, 2).contiguous()


def _llava_next_video(config: Any, encode: Callable[..., Any], traced: list, project: Callable | None,
                      inputs: Mapping[str, Any]) -> torch.Tensor:
    videos = inputs["pixel_values_videos"]
    if videos.dim() != 5:
        raise UnsupportedError(
            f"pixel_values_videos of shape {tuple(videos.shape)}: {config.model_type} takes "
            "[videos, frames, channels, height, width], as its video processor returns them"
        )
    if len(traced) != 1:
        raise UnsupportedError(f"the vision tower was traced with {traced}; expected the frames' pixel values only")
    selected = select_vision_feature(config, encode(**{traced[0]: videos.flatten(0, 1)}))
    pooled = _spatial_pool(config, selected)
    projected = project(pooled) if project is not None else pooled
    return projected.reshape(-1, projected.shape[-1])


#: model_type -> its video glue (:data:`VideoGlue`)
VIDEO_GLUE: dict[str, VideoGlue] = {"qwen2_vl": _qwen2_vl, "llava_next_video": _llava_next_video}


def video_features(config: Any, encode: Callable[..., Any], traced: list, project: Callable | None,
                   inputs: Mapping[str, Any]) -> torch.Tensor:
    """The features of ``inputs["pixel_values_videos"]`` as ``[video tokens, hidden]``, in the prompt's order.

    Raises:
        UnsupportedError: The model type has no glue in :data:`VIDEO_GLUE`, or the inputs do not fit it.
    """
    glue = glue_for(VIDEO_GLUE, config, "video frames", "videos", "pass images, or generate with the eager model")
    return glue(config, encode, traced, project, inputs)
