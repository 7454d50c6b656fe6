"""ExecuTorch: a memory view planned larger than its base gets a base as large before memory planning.

``to_executorch`` turns each ``view_copy`` into a ``memory.view`` that shares its base's memory
(``ReplaceViewCopyWithViewPass``), then evaluates every tensor's symbolic shape to its upper bound, the base's and
the view's each on its own (``ConstraintBasedSymShapeEvalPass``; "We do not guard nbytes because dynamic symints are
replaced by upper bounds", exir/passes/replace_view_copy_with_view_pass.py). Where the view's sizes are another
expression of the same symbols, the bounds differ: Qwen2.5-VL's vision window index ``[s98, 4, (16 * (X // 384)) //
(X // 1536)]`` is viewed as ``[X // 384, ...]``, and the view's bound is the larger; the planner reserves the base's
bytes and the runtime refuses to load the method ("offset_bytes (15007744) + size_bytes (131072) >= allocator size
(15040832)", error 0x21; LongT5's encoder too, before its sizes' ``%`` was rewritten: executorch_sym_mod). Both
bounds are bounds of one number of elements, so a base as large as its largest view is still a valid plan: this
grows the base's leading dim until it holds every view of it (the leading dim's stride does not change). Drop it
once the views' bounds are taken from their bases.

``executorch-dynamic-view-of-static-base``: the same pass makes a view of a static tensor whose own sizes are read
from a tensor (a static patch list viewed as ``[t, h // 2, 2, w // 2, 2, c]`` by its grid: Video-LLaMA 3's tower
with static inputs) a memory view too, and its spec refuses the pair ("_ViewSpec is incompatible with
its base on creation. It has shape_dynamism=1, but its base has shape_dynamism=0"). Such a ``view_copy`` stays a
copy (the portable kernel's ``view_copy.out``). So does a view whose element count torch cannot prove equal to its
base's (sizes read from tensors, as other expressions of the reads: LFM2-VL's image grid, its two columns merged),
where the spec's ``nbytes`` comparison asked a data-dependent guard ("Could not guard on data-dependent expression
Ne(8*u258*(...), 256*u252)"). Drop it once a memory view may be dynamic over a static base and the spec compares
sizes it can decide.
"""

from __future__ import annotations

import math
from typing import Any

from .registry import patch_attribute, run_after, workaround

__all__ = ["fit_bases_to_views"]


def fit_bases_to_views(graph_module: Any) -> int:
    """Grow each ``memory.view`` base whose upper-bound bytes are fewer than a view's (the shapes already evaluated
    to their bounds), in place; returns how many bases grew."""
    import torch
    from executorch.exir.passes.replace_view_copy_with_view_pass import _VIEW_OP, _ViewSpec

    needed: dict[int, tuple[Any, int]] = {}
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            spec = node.meta.get("spec")
            if node.op != "call_function" or node.target is not _VIEW_OP or not isinstance(spec, _ViewSpec):
                continue
            base = spec._base
            view_bytes = spec.nbytes()
            if view_bytes > base.nbytes():
                known = needed.get(id(base), (base, 0))[1]
                needed[id(base)] = (base, max(known, view_bytes))
    grown = 0
    for base, view_bytes in needed.values():
        shape = list(base.shape)
        if not shape or shape[0] == 0:
            continue
        row_bytes = base.nbytes() // shape[0]
        if row_bytes == 0:
            continue
        shape[0] = math.ceil(view_bytes / row_bytes)
        base.shape = shape  # (a contiguous tensor's strides do not read its leading dim)
        grown += 1
    return grown


@workaround(
    id="executorch-view-bounds",
    backend="executorch",
    target="executorch.exir.passes.sym_shape_eval_pass.ConstraintBasedSymShapeEvalPass.call",
    breaks="a method whose memory view has a larger upper bound than its base fails to load: 'offset_bytes + "
    "size_bytes >= allocator size', error 0x21 (Qwen2.5-VL's and EXAONE 4.5's vision towers)",
    upstream="executorch exir/passes/replace_view_copy_with_view_pass.py (nbytes not guarded); no issue known",
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply(model: Any, inputs: dict):
    from executorch.exir.passes.sym_shape_eval_pass import ConstraintBasedSymShapeEvalPass

    return run_after(ConstraintBasedSymShapeEvalPass, "call",
                     lambda result, self, graph_module: fit_bases_to_views(graph_module))


def stays_a_copy(node: Any) -> bool:
    """Whether a ``view_copy`` node's sizes are dynamic where its base's are not (or the reverse), or torch cannot
    tell that it has as many elements as its base (sizes read from tensors, as different expressions: the memory
    view's spec compares the two and asks a data-dependent guard, LFM2-VL's image features)."""
    import torch
    from executorch.exir.tensor import determine_tensor_dynanism
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    base = node.args[0] if node.args else None
    view, source = node.meta.get("val"), getattr(base, "meta", {}).get("val")
    if not isinstance(view, torch.Tensor) or not isinstance(source, torch.Tensor):
        return False
    if determine_tensor_dynanism(view.shape) != determine_tensor_dynanism(source.shape):
        return True
    return not statically_known_true(view.numel() == source.numel())


@workaround(
    id="executorch-dynamic-view-of-static-base",
    backend="executorch",
    target="executorch.exir.passes.replace_view_copy_with_view_pass (_is_view_copy, _ViewSpec)",
    breaks="a view with data-dependent sizes of a static tensor fails to lower: '_ViewSpec is incompatible with its "
    "base on creation. It has shape_dynamism=1, but its base has shape_dynamism=0' (Video-LLaMA 3's tower); so does "
    "one sized by other expressions of the reads than its base: 'Could not guard on data-dependent expression Ne(...)' "
    "(LFM2-VL's image grid)",
    upstream="executorch exir/passes/replace_view_copy_with_view_pass.py; no issue known",
    versions={"executorch": ">=0.6,<1.6"},
)
def _apply_dynamic_views(model: Any, inputs: dict):
    from executorch.exir.passes import replace_view_copy_with_view_pass as views

    original = views._is_view_copy

    def is_view_copy(node: Any) -> bool:
        return original(node) and not stays_a_copy(node)

    return patch_attribute(views, "_is_view_copy", is_view_copy)
