"""All backends: ``torch.distributions`` do not validate their arguments while a model is traced.

A distribution built in a forward validates its parameters by default (``Distribution._validate_args``, on unless
Python runs with ``-O``): ``Categorical(logits=...)`` checks ``constraint.check(logits).all()``, a branch on tensor
values. The trace cannot take it (BLT's patcher scores its bytes by the entropy of a ``Categorical``,
modeling_blt.py: "Could not guard on data-dependent expression Eq(u0, 1)"), and the fallback that traces with the
sample's real values then met uninitialised memory in the check now and then ("found invalid values"), so BLT's
export passed or failed from run to run. The check is a debugging aid of eager code, not part of the model's
computation: it is off while tracing (``torch.distributions.Distribution.set_default_validate_args(False)``, restored
after), for a model whose modeling code names ``torch.distributions``. Seen with torch 2.13; drop it once the constraint checks are traceable (no upstream issue known).
"""

from __future__ import annotations

from typing import Any

from .registry import modeling_code_names, patch_attribute, workaround


def _builds_distributions(model: Any, inputs: dict) -> bool:
    return modeling_code_names(model, "distributions")


@workaround(
    id="distribution-validate-args",
    backend="all",
    target="torch.distributions.Distribution._validate_args during a trace",
    breaks="a distribution built in the forward (BLT's Categorical) validates its logits with a branch on their "
    "values: 'Could not guard on data-dependent expression Eq(u0, 1)', and the real-value fallback is flaky on it",
    upstream=None,
    versions={"torch": ">=2.0,<2.14"},
    applies=_builds_distributions,
)
def _apply(model: Any, inputs: dict):
    import torch.distributions

    return patch_attribute(torch.distributions.Distribution, "_validate_args", False)
