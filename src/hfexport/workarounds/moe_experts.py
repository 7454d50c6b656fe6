"""ExecuTorch, OpenVINO: run MoE experts as ``batched_mm`` instead of ``grouped_mm`` while exporting.

transformers picks the ``grouped_mm`` experts implementation by default (``torch._grouped_mm``, or its
``transformers::grouped_mm_fallback`` custom op on CPU, with ``aten.histc`` to count tokens per expert). Neither
backend has a grouped matmul:

- ExecuTorch: XNNPACK does not delegate it, the portable/optimized kernel libraries have no ``_grouped_mm.out``, and
  MLX has no lowering, so the edge verifier or the runtime fails on it. Drop once ExecuTorch ships the kernel.
- OpenVINO: its PyTorch frontend has no conversion rule for any of the three ("No conversion rule found for
  operations: aten.empty_permuted.default, aten.histc.default, transformers.grouped_mm_fallback.default"). Drop
  once the frontend converts grouped matmuls.

Any backend: where transformers resolved ``eager`` experts (``grouped_mm`` cannot dispatch for the model: OpenAI's
privacy filter, with transposed weights and biases), the eager loop runs over the experts hit (``nonzero()``, then
one index at a time) and torch.export cannot guard on that data-dependent count ("Could not guard on
data-dependent expression Eq(u0, 0)"). Drop once the eager experts loop traces (a ``torch.cond`` per expert).

``batched_mm`` computes the same experts with ``bmm``, which every backend runs (gathering each token's experts'
weights: memory grows with tokens x top-k at prefill). The model's own choice
(``get_experts_implementation()``) is put back on exit. Each backend has its own workaround (reason, versions).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .registry import Workaround, register_workaround

__all__ = ["uses_grouped_mm_experts", "uses_eager_experts", "use_batched_mm_experts"]


def uses_grouped_mm_experts(model: Any, inputs: dict) -> bool:
    """Whether ``model``, or a model inside it, resolved its experts implementation to ``grouped_mm`` (and can
    switch it)."""
    return bool(_experts_models(model, "grouped_mm"))


def uses_eager_experts(model: Any, inputs: dict) -> bool:
    """Whether ``model``, or a model inside it, resolved its experts implementation to ``eager`` (and can switch
    it)."""
    return bool(_experts_models(model, "eager"))


def _resolved_experts(model: Any) -> str | None:
    can_set = getattr(model, "_can_set_experts_implementation", None)
    if not callable(can_set) or not can_set() or not callable(getattr(model, "get_experts_implementation", None)):
        return None
    # the implementation transformers resolved for this model (``None`` was resolved to grouped_mm or eager)
    return getattr(model.config, "_experts_implementation_internal", None)


def _experts_models(model: Any, implementation: str) -> list[Any]:
    """The outermost models in ``model`` (itself first) that can switch their experts and resolved them to
    ``implementation``: a composite whose other tower cannot switch (Nemotron-H Omni's RADIO vision model, the
    Nemotron 3.5 transcriber's audio tower) says it cannot as a whole, while its language model can."""
    if _resolved_experts(model) == implementation:
        return [model]
    children = getattr(model, "children", None)
    return [m for child in (children() if callable(children) else ()) for m in _experts_models(child, implementation)]


def _batched_mm(implementation: str) -> Callable[[Any, dict], Callable[[], None]]:
    def apply(model: Any, inputs: dict) -> Callable[[], None]:
        """Switch each such model to ``batched_mm``; the returned undo puts each one's own choice back."""
        switched = [(m, m.get_experts_implementation()) for m in _experts_models(model, implementation)]
        for m, _ in switched:
            m.set_experts_implementation("batched_mm")

        def undo() -> None:
            for m, before in reversed(switched):
                m.set_experts_implementation(before)

        return undo

    return apply


use_batched_mm_experts = _batched_mm("grouped_mm")


for _backend, _versions, _breaks in (
    ("executorch", {"executorch": ">=1.0,<1.6"},
     "MoE experts traced as grouped_mm (torch._grouped_mm / transformers::grouped_mm_fallback) have no ExecuTorch "
     "kernel: XNNPACK does not delegate them and the portable kernels lack _grouped_mm.out"),
    ("openvino", {"openvino": ">=2024.0,<2027"},
     "MoE experts traced as grouped_mm (transformers::grouped_mm_fallback, aten.histc) have no OpenVINO conversion "
     "rule"),
):
    register_workaround(Workaround(
        id=f"{_backend}-moe-batched-mm",
        backend=_backend,
        target="transformers.PreTrainedModel.set_experts_implementation",
        breaks=_breaks,
        upstream=None,
        versions=_versions,
        apply=use_batched_mm_experts,
        applies=uses_grouped_mm_experts,
    ))

register_workaround(Workaround(
    id="moe-eager-batched-mm",
    backend="all",
    target="transformers.PreTrainedModel.set_experts_implementation",
    breaks="transformers' eager experts loop over the experts hit (nonzero(), one index at a time): torch.export "
    "cannot guard on the data-dependent count (GuardOnDataDependentSymNode: Eq(u0, 0))",
    upstream="transformers integrations/moe.py eager experts forward; no issue known",
    versions={"transformers": ">=5.0,<5.24"},
    apply=_batched_mm("eager"),
    applies=uses_eager_experts,
))
