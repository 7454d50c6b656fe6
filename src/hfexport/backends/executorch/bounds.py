"""Finite upper bounds for the dynamic dims of a traced program, which ExecuTorch's memory planning needs.

ExecuTorch plans every tensor at its upper bound, and a ``Dim.AUTO`` dim has none (``int_oo``): its planner then
falls back to the size seen while tracing, and the program refuses any larger input at run time ("Attempted to
resize a bounded tensor"). Before lowering we give each unbounded symbol a cap: a batch dim (dim 0 of a user input)
``max(4 x traced, 8)``; an image's height and width (the last two dims of a floating-point input of rank 4 or more
named for pixels, images or video: ``pixel_values``, ``pixel_values_videos``, or an encoder's output feature map
passed to a decode step, PP-FormulaNet's ``[batch, channels, height, width]``, whose size follows its image's) the
traced size, and its count of images or frames or channels (its other dims) ``max(4 x traced, 8)`` as a batch; any
other ``max(4 x traced, 512)`` (the feature map at 512 each planned 4 GiB, twice). A
processor resizes images to one size, and activations grow with the square of the patches (attention over them with
their square again): a tiny vision tower traced at 32 x 32 and planned at 512 x 512 for a batch of 8 planned 7 GiB.
An explicit ``dynamic_shapes`` with ``Dim(max=...)`` keeps its own bound (pass one to take larger images). A size
read from a tensor (``u0 = grid[0].item()``, with static inputs too) has no traced value: it takes 4 x the value the
sample inputs give it (the program run once on them), else the length rule (512 each planned LFM3-VL's tower, three
sizes multiplied, at 128 GiB); a larger one fails at run time as a larger input does. ``to_edge`` and
``to_executorch`` trace again and make new symbols of such reads, without those caps: ``cap_late_reads`` gives them
the length rule's when memory is planned (a divisor at least 1, a read squared as far below 0 as above). (Not solved:
where ``to_edge``'s new trace meets a guard on such a size that the first trace settled, e.g. ``end < 0`` then
``end > 16`` in a slice's decomposition of LFM2-VL and BLT; a second lowering of the same program with the reads
capped at the sample's values met torch's "possible memo disaster" in rebind_unbacked.)
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch.utils._sympy.numbers import IntInfinity, int_oo
from torch.utils._sympy.value_ranges import ValueRanges

__all__ = ["cap_dynamic_dims", "cap_late_reads", "BATCH_FLOOR", "LENGTH_FLOOR"]

logger = logging.getLogger(__name__)

BATCH_FLOOR = 8
LENGTH_FLOOR = 512
_GROWTH = 4
_IMAGE_NAMES = ("pixel", "image", "video", "encoder_outputs")  # (an encoder's output: a feature map, by _is_image)
_HUGE = 2**62  # a read's range as torch leaves it: [0, 2**63 - 2], which a product or a square takes to int_oo


def _unbounded(bound) -> bool:
    return bound is int_oo or isinstance(bound, IntInfinity)


def _is_image(name: str, value: torch.Tensor) -> bool:
    """An input of images or video frames (not a cache, whose last dims are positions and head size)."""
    return value.is_floating_point() and value.dim() >= 4 and any(k in name for k in _IMAGE_NAMES)


def cap_dynamic_dims(program: torch.export.ExportedProgram) -> dict[str, int]:
    """Give every unbounded symbol of ``program`` a finite upper bound, in place; return ``{symbol: cap}``."""
    shape_env, batch, spatial, counts = None, set(), set(), set()
    user_inputs = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op != "placeholder":
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for dim, size in enumerate(value.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_Symbol:
                shape_env = size.node.shape_env
                if dim == 0 and node.name in user_inputs:
                    batch.add(size.node.expr)
                elif node.name in user_inputs and _is_image(node.name, value):
                    (spatial if dim >= value.dim() - 2 else counts).add(size.node.expr)
    if shape_env is None:  # static inputs: the sizes read from a tensor (``u0 = t.item()``) are still symbols
        shape_env = _read_sizes_env(program)
    if shape_env is None:
        return {}
    hints = getattr(shape_env, "backed_var_to_val", None) or shape_env.var_to_val
    read = _sample_reads(program)
    caps = {}
    for symbol, bounds in list(shape_env.var_to_range.items()):
        if not _unbounded(bounds.upper):
            continue
        seen = int(hints.get(symbol, 1))
        if symbol in read:
            cap = max(_GROWTH * read[symbol], 1)
        elif symbol in batch or symbol in counts:
            cap = max(_GROWTH * seen, BATCH_FLOOR)
        elif symbol in spatial:
            cap = max(seen, 1)
        else:
            cap = max(_GROWTH * seen, LENGTH_FLOOR)
        shape_env.var_to_range[symbol] = ValueRanges(bounds.lower, cap)
        caps[symbol] = cap
    constraints = program.range_constraints
    for symbol, bounds in list(constraints.items()):
        if symbol in caps and _unbounded(bounds.upper):
            constraints[symbol] = ValueRanges(bounds.lower, caps[symbol])
    if caps:
        logger.info("ExecuTorch plans dynamic dims up to: %s (pass dynamic_shapes with Dim(max=...) to choose)",
                    ", ".join(f"{s}<={c}" for s, c in caps.items()))
    return {str(s): c for s, c in caps.items()}


def cap_late_reads(graph_module: torch.fx.GraphModule) -> dict[str, int]:
    """Give each size read from a tensor that is still unbounded when memory is planned the length rule's cap
    (``LENGTH_FLOOR``), in place; return ``{symbol: cap}``. ``to_edge`` and ``to_executorch`` trace the program
    again, and a read's new symbol there (``u67 = _local_scalar_dense(...)``, where the program had ``u1 =
    item(...)``, capped) comes without the bound its first one was given: "Cannot evaluate a finite upper bound for
    symbolic expression u67 (int_oo)" (IDEFICS 2's patches per image, read from its pixel attention mask, split by)."""
    caps: dict[str, int] = {}
    for size in _planned_sizes(graph_module):
        env = size.node.shape_env
        for symbol in size.node.expr.free_symbols:
            bounds = env.var_to_range.get(symbol)
            if not str(symbol).startswith("u"):
                continue
            if bounds is None or _unbounded(bounds.upper) or bounds.upper >= _HUGE:
                bounds = env.var_to_range[symbol] = ValueRanges(0 if bounds is None else bounds.lower, LENGTH_FLOOR)
                caps[str(symbol)] = LENGTH_FLOOR
            if bounds.lower < -bounds.upper:  # (a read not known to be a size, squared: Nemotron-H Omni's grid side,
                # in [-int_oo, 8]: as far from 0 below as above)
                env.var_to_range[symbol] = ValueRanges(-bounds.upper, bounds.upper)
        _nonzero_divisors(size.node.expr, env.var_to_range)
    if caps:
        logger.info("ExecuTorch plans sizes read from tensors (traced again) up to: %s",
                    ", ".join(f"{s}<={c}" for s, c in caps.items()))
    return caps


def _planned_sizes(graph_module: torch.fx.GraphModule) -> Any:
    """Every symbolic size and stride the memory planner evaluates: each node's tensor specs and values, in every
    graph module (``ConstraintBasedSymShapeEvalPass`` reads the specs' shapes and strides, submodules included)."""
    for module in graph_module.modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for node in module.graph.nodes:
            for value in torch.utils._pytree.tree_leaves([node.meta.get("spec"), node.meta.get("val")]):
                if isinstance(value, torch.Tensor):
                    sizes = [*value.shape, *value.stride()]
                elif hasattr(value, "shape") and hasattr(value, "stride"):  # a TensorSpec
                    sizes = [*value.shape, *(value.stride or ())]
                else:
                    sizes = [value]
                yield from (s for s in sizes if isinstance(s, torch.SymInt))


def _nonzero_divisors(expr: Any, ranges: dict) -> None:
    """Raise the lower bound of the read sizes a size divides by until each divisor is at least 1, in place: a read
    may be 0 as far as torch knows, so ``u317 // u312`` had no upper bound (Inkling 2's patches per tile), while the
    program divides by it and so never sees it 0. (``u151 // 2`` as a divisor: ``u151`` >= 2.)"""
    from torch.utils._sympy.functions import FloorDiv, Mod
    from torch.utils._sympy.value_ranges import bound_sympy

    for atom in expr.atoms(FloorDiv, Mod):
        divisor = atom.args[1]
        reads = [s for s in divisor.free_symbols if str(s).startswith("u")]
        for floor in (1, 2, 4, 8, 16, 32, 64):
            if not reads or bound_sympy(divisor, ranges).lower >= 1:
                break
            for symbol in reads:
                bounds = ranges.get(symbol, ValueRanges(0, LENGTH_FLOOR))
                if bounds.lower < floor <= bounds.upper:
                    ranges[symbol] = ValueRanges(floor, bounds.upper)


def _read_sizes_env(program: torch.export.ExportedProgram) -> Any:
    """The shape environment of a program whose inputs are static, through the sizes it reads from tensors; ``None``
    when it reads none. (Without it, such a program kept them unbounded and the planner refused it: "Cannot evaluate
    a finite upper bound for symbolic expression u100", Siglip 2's position table resampled to its grid.)"""
    return next((v.node.shape_env for v in (n.meta.get("val") for n in program.graph.nodes)
                 if isinstance(v, torch.SymInt)), None)


def _sample_reads(program: torch.export.ExportedProgram) -> dict:
    """``{symbol: value}`` of the sizes the program reads from tensors (``u0 = grid[0].item()``), as its sample
    inputs give them (the program run once on ``example_inputs``); empty where it has none or cannot run."""
    nodes = [n for n in program.graph.nodes if isinstance(n.meta.get("val"), torch.SymInt)
             and n.meta["val"].node.expr.is_Symbol and str(n.meta["val"].node.expr).startswith("u")]
    example = getattr(program, "example_inputs", None)
    if not nodes or not example:
        return {}
    wanted = {n.name: n.meta["val"].node.expr for n in nodes}
    values: dict = {}

    class _Reads(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> object:
            result = super().run_node(node)
            if node.name in wanted and isinstance(result, int):
                values[wanted[node.name]] = result
            return result

    module = program.module()
    args, kwargs = example
    flat = torch.utils._pytree.tree_leaves((args, kwargs))
    try:
        with torch.no_grad():
            _Reads(module).run(*flat)
    except Exception:  # noqa: BLE001 - no sample values: the length rule's cap stays
        logger.debug("the sample run that reads the program's sizes failed", exc_info=True)
        return {}
    return values
