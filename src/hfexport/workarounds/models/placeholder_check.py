"""HunYuan-VL, GLM-Image: trace ``get_placeholder_mask`` without its Python check of the image features' count.

These two models' ``get_placeholder_mask`` (transformers' modeling_hunyuan_vl.py, modeling_glm_image.py) check
``if inputs_embeds[mask].numel() != image_features.numel(): raise ValueError(...)`` in Python, where the other ~100
use ``torch_compilable_check``: both counts depend on the prompt's values (the image tokens, the grid), and
torch.export cannot guard on them ("Could not guard on data-dependent expression Ne(u17, 64*u15 + 64*u16)"), so the
whole model does not trace with an image. The check only validates the caller's prompt (which the processor builds
to match): while tracing, the method is called without the features, which skips the check and nothing else (the
mask comes from the token ids alone). Drop it once these models use ``torch_compilable_check``.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from typing import Any

from ..registry import patch_attribute, undo_all, workaround

#: modeling module -> the class whose get_placeholder_mask raises in Python
_OWNERS = {
    "transformers.models.hunyuan_vl.modeling_hunyuan_vl": "HunYuanVLModel",
    "transformers.models.glm_image.modeling_glm_image": "GlmImageModel",
}


def _owners() -> list[type]:
    return [getattr(sys.modules[m], name) for m, name in _OWNERS.items()
            if m in sys.modules and hasattr(sys.modules[m], name)]


def _unchecked(original: Callable) -> Callable:
    signature = inspect.signature(original)
    features = [name for name in signature.parameters if name.endswith("_features")]

    def get_placeholder_mask(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        for name in features:
            if name in bound.arguments:
                bound.arguments[name] = None
        return original(*bound.args, **bound.kwargs)

    return get_placeholder_mask


def _applies(model: Any, inputs: dict) -> bool:
    owners = tuple(_owners())
    return bool(owners) and hasattr(model, "modules") and any(isinstance(m, owners) for m in model.modules())


@workaround(
    id="placeholder-count-check",
    backend="all",
    target="transformers HunYuanVLModel / GlmImageModel .get_placeholder_mask",
    breaks="a Python `if tokens != features: raise` on two data-dependent counts: the whole model does not trace "
    "with an image (GuardOnDataDependentSymNode: Ne(u17, 64*u15 + 64*u16))",
    upstream="transformers models/hunyuan_vl/modeling_hunyuan_vl.py and models/glm_image/modeling_glm_image.py "
    "get_placeholder_mask (not torch_compilable_check); no issue known",
    versions={"transformers": ">=5.0,<5.24"},
    applies=_applies,
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    undos = [patch_attribute(cls, "get_placeholder_mask", _unchecked(cls.get_placeholder_mask)) for cls in _owners()]
    return undo_all(undos)
