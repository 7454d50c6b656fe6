"""Autoformer and Informer: no bidirectional mask materialised while exporting where none was given.

Their encoders call ``create_bidirectional_mask`` without an attention mask. Eagerly, transformers' SDPA mask then
returns ``None`` (nothing to hide); while ``torch.export`` traces, ``_ignore_bidirectional_mask_sdpa``
(transformers ``masking_utils.py``) refuses to skip it, so as not to read a padding mask's values, even though there
is no padding mask to read, and an all-true ``[batch, 1, q, kv]`` mask is built. Both models' attention only works
without one: Autoformer's autocorrelation views its ``[batch * heads, q, head_dim]`` weights as ``[batch, heads, q,
kv]`` to add the mask ("shape '[s11, 2, 4, 4]' is invalid for input of size 256*s11"), Informer's ProbSparse
attention keeps ``u < q`` query rows and then checks the mask against all of them ("Attention mask should be of size
(2, 1, 2, 2)"). Where no padding mask and no local window are given, skipping reads no data, so it is decided the
same way while exporting; a given mask still goes upstream's way. Drop it once upstream skips a missing padding mask
under export too.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ..registry import patch_attribute, uses_class, workaround

_MASKING = "transformers.masking_utils"
_MODELS = (("transformers.models.autoformer.modeling_autoformer", "AutoformerEncoder"),
           ("transformers.models.informer.modeling_informer", "InformerEncoder"))


def _applies(model: Any, inputs: dict) -> bool:
    return any(uses_class(model, module, name) for module, name in _MODELS)


@workaround(
    id="series-encoder-mask-skip",
    backend="all",
    target=f"{_MASKING}._ignore_bidirectional_mask_sdpa",
    breaks="Autoformer's and Informer's encoders get an all-true mask while exporting (None eagerly), which their "
    "autocorrelation / ProbSparse attention cannot take: the trace fails on a view or on the mask's size check",
    upstream="transformers masking_utils.py _ignore_bidirectional_mask_sdpa (is_torchdynamo_exporting() also when "
    "padding_mask is None); no issue known",
    versions={"transformers": ">=5.0,<5.24"},
    applies=_applies,
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    masking = sys.modules.get(_MASKING) or __import__(_MASKING, fromlist=["_"])
    original = masking._ignore_bidirectional_mask_sdpa

    def ignore(padding_mask: Any, kv_length: int, local_attention_size: int | None = None) -> bool:
        if padding_mask is None and (local_attention_size is None or kv_length < local_attention_size):
            return True
        return original(padding_mask, kv_length, local_attention_size)

    return patch_attribute(masking, "_ignore_bidirectional_mask_sdpa", ignore)
