"""torch.export: name the inputs a forward takes only through ``**kwargs``, so their ``dynamic_shapes`` are accepted.

Some models' forward passes part of its inputs on through ``**kwargs`` (Evolla's ``past_key_values``, a wrapper
VLM's language model). torch.export matches a ``dynamic_shapes`` dict against the forward's bound signature, where
such inputs sit under the var-keyword name; but torch 2.13's ``_get_range_constraints``
(torch/export/_trace.py, ``combined_args_traced_order``) then lists them twice, once nested under that name and once
at the top level, and the flattened shapes no longer match the graph's inputs ("Must provide a tree_name when
there might be a mismatch"). With a flat dict torch refuses the keys instead ("top-level keys must be the arg
names"). This gives the model, while it is traced, a ``forward`` whose signature names those inputs as keyword-only
parameters (it calls the original forward unchanged), so the flat dict is the signature's own. Drop it once
torch binds var-keyword inputs once in ``_get_range_constraints``.
"""

from __future__ import annotations

import inspect
from typing import Any

from .registry import workaround

__all__ = ["swallowed_inputs"]


def swallowed_inputs(model: Any, inputs: dict) -> list[str]:
    """The ``inputs`` keys that ``model.forward`` has no parameter of its own for (taken through ``**kwargs``)."""
    forward = getattr(model, "forward", None)
    if forward is None:
        return []
    params = inspect.signature(forward).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [k for k in inputs if k not in params]


@workaround(
    id="torch-export-var-keyword-inputs",
    backend="all",
    target="torch.export.export (dynamic_shapes of inputs a forward takes through **kwargs)",
    breaks="a model whose forward passes an input on through **kwargs (Evolla's cache, a VLM's language model) "
    "fails torch.export with dynamic shapes: a flat dict is refused, a nested one is bound twice",
    upstream="torch/export/_trace.py _get_range_constraints (combined_args_traced_order)",
    versions={"torch": "<2.14"},
    applies=lambda model, inputs: bool(swallowed_inputs(model, inputs)),
)
def _apply(model: Any, inputs: dict):
    original = model.forward
    signature = inspect.signature(original)
    named = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    added = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=None) for k in swallowed_inputs(model, inputs)]
    var_keyword = [p for p in signature.parameters.values() if p.kind is inspect.Parameter.VAR_KEYWORD]

    def forward(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    forward.__signature__ = signature.replace(parameters=[*named, *added, *var_keyword])
    had_own = "forward" in vars(model)
    model.forward = forward

    def undo() -> None:
        if had_own:
            model.forward = original
        else:
            del model.forward

    return undo
