"""ONNX: the optimizer's "no-op" rules remove only an exact ``+ 0``, ``- 0``, ``* 1``, ``/ 1``.

onnxscript's rewriter drops ``Add(x, 0)``, ``Sub(x, 0)``, ``Mul(x, 1)`` and ``Div(x, 1)``
(onnxscript/rewriter/rules/common/_no_op.py, in its default rules, run by ``torch.onnx.export(optimize=True)``), and
matches the constant with ``math.isclose`` and the pattern's default tolerances (``rel_tol=1e-5, abs_tol=1e-8``,
onnxscript/rewriter/_pattern_ir.py ``Constant``). So a norm's ``eps`` of 1e-8 "is" 0 and goes, and a scale of
1.000001 "is" 1: MuseSpark's ``MuseSparkRMSNorm(eps=1e-8)`` after attention became ``x * (mean(x^2))^-0.5``, and the
rows left padding zeroes became ``0 * inf = NaN`` (MuseSpark and MuseGlimmer, text and full models, "max abs diff nan").
While hfexport's optimiser runs (``backends/onnx/optimize.py``), those rules' constants match exactly. Drop it once onnxscript compares them exactly.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["no_op_constants"]


def no_op_constants() -> list[Any]:
    """The constant patterns (``0`` and ``1``) of onnxscript's no-op rules, every commuted copy."""
    from onnxscript.rewriter import _pattern_ir
    from onnxscript.rewriter.rules.common import _no_op

    found: list[Any] = []
    seen: set[int] = set()
    stack: list[Any] = list(_no_op.rules.rules)
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, _pattern_ir.Constant):
            found.append(obj)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend([*obj.keys(), *obj.values()])
        elif type(obj).__module__.startswith("onnxscript.rewriter") and hasattr(obj, "__dict__"):
            stack.extend(vars(obj).values())
    return found


@workaround(
    id="onnx-no-op-tolerance",
    backend="onnx",
    target="onnxscript.rewriter.rules.common._no_op (Add 0 / Sub 0 / Mul 1 / Div 1 matched with abs_tol=1e-8, "
    "rel_tol=1e-5)",
    breaks="a norm's eps of 1e-8 is removed as '+ 0' (MuseSpark, MuseGlimmer: NaN on rows left padding zeroes); a "
    "scale within 1e-5 of 1 is removed as '* 1'",
    upstream=None,
    versions={"onnxscript": "<=0.7.0"},
)
def _apply(model: Any, inputs: dict):
    constants = no_op_constants()
    saved = [(c, c._rel_tol, c._abs_tol) for c in constants]
    for constant in constants:
        constant._rel_tol, constant._abs_tol = 0.0, 0.0

    def undo() -> None:
        for constant, rel, abs_ in saved:
            constant._rel_tol, constant._abs_tol = rel, abs_

    return undo
