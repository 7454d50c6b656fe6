"""ExecuTorch: the edge verifier no longer pins the batch of a ``split`` (an op returning one ``Tensor[]``).

``to_edge``'s dtype check (``EdgeOpArgValidator.call_function``, executorch/exir/verification/arg_validator.py)
walks an op's schema returns beside the node's value. For an op whose only return is a ``Tensor[]``
(``split_with_sizes_copy``, ``unbind_copy``: GPT-2's q/k/v split of ``c_attn``, Aya Vision's and Cohere2-Vision's
projector halves) the value is the list itself, but the validator iterates it as if it held one value per return:
the first return's value becomes the list's first tensor, and ``len()`` of that tensor is its first size, converted
to an int. When that size is the symbolic batch, the conversion guards it to the traced value, program-wide: the
input specs keep a ``SymInt`` equal to 2 while the views computed from them are static, and
``ReplaceViewCopyWithViewPass`` refuses the mix ("_ViewSpec is incompatible with its base on creation. It has
shape_dynamism=0, but its base has shape_dynamism=1"). The decode graphs of GPT-2 and GPT-SW3 and those projectors
did not lower at all.

The fix hands the validator the node's value wrapped as the one return it is, for the length of the check. Seen with
executorch 1.5.1; no upstream issue known; drop it once the validator pairs a single ``Tensor[]`` return with the
whole list.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from .registry import patch_attribute, workaround

_MODULE = "executorch.exir.verification.arg_validator"


def single_list_return(target: Any) -> bool:
    """Whether ``target``'s schema returns exactly one ``Tensor[]``."""
    schema = getattr(target, "_schema", None)
    returns = schema.returns if schema is not None else ()
    return len(returns) == 1 and returns[0].type == torch.ListType.ofTensors()


@workaround(
    id="executorch-list-return-guard",
    backend="executorch",
    target=f"{_MODULE}.EdgeOpArgValidator.call_function",
    breaks="an op returning one Tensor[] (split_with_sizes_copy) has len() taken of its first tensor by the edge "
    "verifier: the symbolic batch is guarded to its traced value and ReplaceViewCopyWithViewPass refuses the "
    "static views of the now-constant input ('_ViewSpec is incompatible with its base on creation'): GPT-2's decode",
    upstream="executorch/exir/verification/arg_validator.py EdgeOpArgValidator.call_function (kernel_rets of a single "
    "Tensor[] return iterated per element); no issue known",
    versions={"executorch": ">=1.0,<1.6"},
)
def _apply(model: Any, inputs: dict):
    owner = importlib.import_module(_MODULE).EdgeOpArgValidator
    original = owner.call_function

    def call_function(self: Any, target: Any, args: Any, kwargs: Any) -> Any:
        node = getattr(self, "node", None)
        value = node.meta.get("val") if node is not None else None
        if not (isinstance(value, (list, tuple)) and single_list_return(target)):
            return original(self, target, args, kwargs)
        node.meta["val"] = (value,)
        try:
            return original(self, target, args, kwargs)
        finally:
            node.meta["val"] = value

    return patch_attribute(owner, "call_function", call_function)
