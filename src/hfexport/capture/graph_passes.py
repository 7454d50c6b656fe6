"""Passes over a traced program that every backend's lowering may need before its own converter."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["drop_tensor_checks", "fold_split_cat", "program_graphs", "rewrite_nodes", "traced", "resolve_sym_min_max",
           "separate_repeated_outputs", "sym_pow_as_products",
           "size_range", "call_with_value", "sym_mod_as_floordiv", "constant_outputs_as_none"]


def drop_tensor_checks(program: torch.export.ExportedProgram) -> int:
    """Remove the graph's data-dependent tensor checks, in place; returns how many.

    transformers' ``torch_compilable_check`` traces a tensor condition (a multimodal model's "the image features
    match the image tokens") into ``torch._check_tensor_all``: ``_is_all_true(cond).item()``, a ``sym_ite`` and the
    ``_assert_scalar`` nodes of the deferred runtime asserts. ``_is_all_true`` is not core ATen, so ``to_edge``'s
    verifier refuses the program ("Operator aten._is_all_true.default is not in Core ATen"; ExecuTorch drops
    runtime asserts later in its pipeline anyway, ``RemoveGraphAssertsPass``), and torchlib has no ONNX function
    for it ("No ONNX function found for aten._is_all_true"). A check is removed only where
    everything computed from its ``_is_all_true`` ends in asserts; the inputs it guarded are the processor's, which
    build the image tokens to match.
    """
    graph = program.graph_module.graph
    removed = _erase_check_chains(graph, (torch.ops.aten._is_all_true.default,), tensors_ok=True)
    if removed:
        program.graph_module.recompile()
    return removed


def _erase_check_chains(graph: torch.fx.Graph, roots: tuple, tensors_ok: bool) -> int:
    """Erase each node of ``roots``' targets with everything computed from it, where all of that ends in asserts
    (and, unless ``tensors_ok``, holds no tensor); returns how many roots went."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    removed = 0
    for root in [n for n in graph.nodes if n.op == "call_function" and n.target in roots]:
        chain, todo = {root}, [root]
        while todo:
            for user in todo.pop().users:
                if user not in chain:
                    chain.add(user)
                    todo.append(user)
        if any(n.op == "output" or (not n.users and n.target not in _ASSERTS) for n in chain):
            continue  # the value feeds something besides the checks
        if not tensors_ok and any(isinstance(n.meta.get("val"), torch.Tensor) for n in chain):
            continue
        for node in sorted(chain, key=order.__getitem__, reverse=True):
            graph.erase_node(node)
        removed += 1
    return removed


def fold_split_cat(program: torch.export.ExportedProgram) -> int:
    """Replace ``cat(split_with_sizes(x, sizes, d), d)`` over all the pieces in their order by ``x``, in place, and
    drop the sizes' ``item()`` reads where only asserts are left to use them; returns how many splits it folded.

    A multimodal model's ``get_image_features`` splits the tower's output per image by sizes it reads from the
    grid (``split_sizes = (grid.prod(-1) // merge**2).tolist()``) and its forward concatenates the pieces again
    (Qwen2-VL and every model after it). Traced, the sizes are data-dependent symbols (``u0 + u1`` rows):
    ExecuTorch's verifier cannot size them ("Could not extract specialized integer from data-dependent expression
    u29") though the graph's result is ``x`` itself.
    """
    graph = program.graph_module.graph
    folded = 0
    for split in [n for n in graph.nodes if n.op == "call_function"
                  and n.target == torch.ops.aten.split_with_sizes.default]:
        x, sizes, dim = (*split.args, 0)[:3]
        pieces = {}
        for user in split.users:
            if user.target is not operator.getitem:
                break
            pieces[user.args[1]] = user
        else:
            if len(pieces) != len(sizes) or not pieces:
                continue
            ordered = [pieces[i] for i in range(len(sizes))]
            rank = len(x.meta["val"].shape) if isinstance(x.meta.get("val"), torch.Tensor) else None
            for cat in list(ordered[0].users):
                if cat.target != torch.ops.aten.cat.default or rank is None:
                    continue
                operands, cat_dim = (*cat.args, 0)[:2]
                if list(operands) == ordered and cat_dim % rank == dim % rank:
                    cat.replace_all_uses_with(x)
                    graph.erase_node(cat)
                    folded += 1
            if all(not p.users for p in ordered):
                for p in ordered:
                    graph.erase_node(p)
                graph.erase_node(split)
    if folded:  # (the sizes' item() reads, where only asserts are left to use them)
        _erase_check_chains(graph, _READS, tensors_ok=False)
        program.graph_module.recompile()
    return folded


_READS = (torch.ops.aten.item.default, torch.ops.aten._local_scalar_dense.default)
_ASSERTS = (torch.ops.aten._assert_scalar.default, torch.ops.aten._assert_async.msg, torch.ops.aten._assert_async.default)


def program_graphs(program: Any) -> Iterator[tuple[torch.nn.Module, torch.fx.Graph]]:
    """Every FX graph of ``program`` (an ``ExportedProgram`` or a ``GraphModule``) with the module that holds it: the
    top graph and its submodules' (the bodies of control flow), for passes that rewrite nodes wherever they are
    (recompile the module after a change)."""
    for module in getattr(program, "graph_module", program).modules():
        graph = getattr(module, "graph", None)
        if isinstance(graph, torch.fx.Graph):
            yield module, graph


def calls_to(program: Any, targets: tuple[Any, ...]) -> list[torch.fx.Node]:
    """The ``call_function`` nodes of ``targets`` in every graph of ``program`` (see :func:`program_graphs`)."""
    return [node for _, graph in program_graphs(program) for node in graph.nodes
            if node.op == "call_function" and node.target in targets]


def rewrite_nodes(program: Any, rewrite: Callable[[torch.fx.Graph, torch.fx.Node], bool]) -> int:
    """Call ``rewrite(graph, node)`` on every ``call_function`` node of every graph of ``program`` (see
    :func:`program_graphs`); it changes the node in place and says whether it did. Recompiles each changed module;
    returns how many nodes changed. The one loop of the node-by-node passes of the backends' workarounds."""
    count = 0
    for module, graph in program_graphs(program):
        changed = sum(1 for node in list(graph.nodes) if node.op == "call_function" and rewrite(graph, node))
        if changed and isinstance(module, torch.fx.GraphModule):
            module.recompile()
        count += changed
    return count


def narrow_squeezes(program: Any, keep: Callable[[Any], bool]) -> int:
    """Keep, in every ``aten.squeeze.dim`` / ``squeeze.dims`` of ``program``, only the dims whose traced size
    ``keep`` accepts (an ``alias`` of the input where none is left); returns how many nodes changed. The backends'
    squeeze kernels decide from the run-time size what torch decided at trace time (ONNX's ``Squeeze`` refuses a
    size other than 1, ExecuTorch's ``squeeze_copy`` drops a dim traced as symbolic that is 1 at run time)."""
    aten = torch.ops.aten

    def narrow(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
        if node.target not in (aten.squeeze.dim, aten.squeeze.dims):
            return False
        source, value = node.args[0], traced(node.args[0])
        if not isinstance(source, torch.fx.Node) or not isinstance(value, torch.Tensor) or value.dim() == 0:
            return False
        dims = node.args[1] if node.target is aten.squeeze.dims else [node.args[1]]
        kept = [d for d in dims if keep(value.shape[d])]
        if len(kept) == len(dims):
            return False
        if kept:
            node.target, node.args = aten.squeeze.dims, (source, kept)
        else:  # kept as a node (the program's output names may name it)
            node.target, node.args = aten.alias.default, (source,)
        return True

    return rewrite_nodes(program, narrow)


def call_with_value(graph: torch.fx.Graph, target: Any, args: tuple, value: Any,
                    kwargs: dict[str, Any] | None = None) -> torch.fx.Node:
    """A new ``call_function`` node of ``target(*args, **kwargs)`` at the graph's insertion point, its
    ``meta["val"]`` set to ``value`` (the size arithmetic and casts the backends' workarounds write)."""
    node = graph.call_function(target, args, kwargs)
    node.meta["val"] = value
    return node


def int64_before(graph: torch.fx.Graph, node: torch.fx.Node, index: Any) -> torch.fx.Node | None:
    """A cast to int64 of ``index``, inserted before ``node``, where ``index`` is a node traced as an int32 tensor
    (an index the backend takes as int64 only); ``None`` for anything else."""
    value = traced(index)
    if not isinstance(index, torch.fx.Node) or not isinstance(value, torch.Tensor) or value.dtype != torch.int32:
        return None
    with graph.inserting_before(node):
        return call_with_value(graph, torch.ops.aten._to_copy.default, (index,), value.to(torch.int64),
                               {"dtype": torch.int64})


def traced(arg: Any) -> Any:
    """The traced value of a node argument (``meta["val"]``), or the argument itself when it is a constant."""
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def resolve_sym_min_max(program: torch.export.ExportedProgram) -> int:
    """Replace each ``torch.sym_max`` / ``torch.sym_min`` of sizes whose order the program's shape ranges decide by
    the operand that wins; returns how many. MPT's ``max(0, position_bias.size(1) - query_length)`` traces as
    ``torch.sym_max``, a Python function that ExecuTorch's edge verifier refuses (only ``alloc`` may be one:
    ``AssertionError`` in ``check_valid_edge_op``) and OpenVINO's frontend has no rule for; with the query length
    bounded by the bias's size, it is the difference itself. A max whose order the ranges leave open is kept."""
    return rewrite_nodes(program, _resolve_min_max)


def _resolve_min_max(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    if node.target not in (torch.sym_max, torch.sym_min) or len(node.args) != 2:
        return False
    a, b = (traced(x) for x in node.args)
    larger = _larger(a, b) if all(isinstance(v, (int, torch.SymInt)) for v in (a, b)) else None
    if larger is None:
        return False
    winner = node.args[larger if node.target is torch.sym_max else 1 - larger]
    for user in list(node.users):  # (a plain int that wins goes into its users' arguments)
        user.args = torch.fx.node.map_arg(user.args, lambda x: winner if x is node else x)
        user.kwargs = torch.fx.node.map_arg(user.kwargs, lambda x: winner if x is node else x)
    graph.erase_node(node)
    return True


def _larger(a: int | torch.SymInt, b: int | torch.SymInt) -> int | None:
    """0 if ``a >= b`` over the whole of the shape ranges, 1 if ``b >= a``, ``None`` if the ranges leave it open."""
    lower, upper = size_range(a - b)
    if lower >= 0:
        return 0
    if upper <= 0:
        return 1
    return None


def size_range(value: int | torch.SymInt) -> tuple[Any, Any]:
    """The lowest and highest value of a size expression over the program's shape ranges (sympy numbers, possibly
    infinite). Bounded from the ranges themselves (``bound_sympy``), not the shape environment's cached answers, which
    predate the bounds a lowering gives afterwards (ExecuTorch's caps)."""
    from torch.utils._sympy.value_ranges import bound_sympy

    if isinstance(value, int):
        return value, value
    ranges = bound_sympy(value.node.expr, value.node.shape_env.var_to_range)
    return ranges.lower, ranges.upper


def sym_mod_as_floordiv(program: Any) -> int:
    """Rewrite every ``operator.mod`` of symbolic ints in ``program`` as ``a - (a // b) * b``, in place; returns how
    many. The same number for every sign of ``a`` and ``b`` where a converter's or runtime's own ``%`` is not Python's
    (OpenVINO's conversion, ExecuTorch's ``mod.Scalar``), through the floor division that both do as Python does."""
    return rewrite_nodes(program, _mod_as_floordiv)


def _mod_as_floordiv(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    if node.target is not operator.mod or len(node.args) != 2:
        return False
    a, b = node.args
    if not all(isinstance(traced(x), (int, torch.SymInt)) for x in (a, b)):
        return False
    with graph.inserting_before(node):
        quotient = call_with_value(graph, operator.floordiv, (a, b), traced(a) // traced(b))
        whole = call_with_value(graph, operator.mul, (quotient, b), quotient.meta["val"] * traced(b))
        rest = call_with_value(graph, operator.sub, (a, whole), node.meta.get("val"))
    node.replace_all_uses_with(rest)
    graph.erase_node(node)
    return True


def sym_pow_as_products(program: Any) -> int:
    """Rewrite every ``a ** k`` of a symbolic int and a small constant exponent (1 to 8) in ``program`` as
    ``a * a * ...``, in place; returns how many (Video-LLaMA 3's tower squares its merge size: OpenVINO's frontend
    has no rule for ``operator.pow``, ExecuTorch no prim op)."""
    return rewrite_nodes(program, _pow_as_products)


def _pow_as_products(graph: torch.fx.Graph, node: torch.fx.Node) -> bool:
    if node.target is not operator.pow or len(node.args) != 2:
        return False
    base, exponent = node.args
    value = traced(base)
    if not isinstance(value, (int, torch.SymInt)) or type(exponent) is not int or not 1 <= exponent <= 8:
        return False
    result, product = base, value
    with graph.inserting_before(node):
        for _ in range(exponent - 1):
            product = product * value
            result = call_with_value(graph, operator.mul, (result, base), product)
    node.replace_all_uses_with(result)
    graph.erase_node(node)
    return True


def separate_repeated_outputs(program: Any, copy: Callable[[torch.fx.Graph, torch.fx.Node], torch.fx.Node]) -> int:
    """Give every repeat in the output list of ``program`` (an ``ExportedProgram``) a node of its own, made by
    ``copy(graph, node)`` before the output node (its ``meta`` is the node's), the signature entry renamed to match,
    in place; returns how many (the runtimes that refuse one node returned twice: OpenVINO's frontend, XNNPACK)."""
    graph = program.graph_module.graph
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    values = list(output.args[0])
    specs = program.graph_signature.output_specs
    seen: set[torch.fx.Node] = set()
    count = 0
    for i, value in enumerate(values):
        if not isinstance(value, torch.fx.Node):
            continue
        if value in seen:
            with graph.inserting_before(output):
                separate = copy(graph, value)
            separate.meta = dict(value.meta)
            values[i] = separate
            if i < len(specs) and getattr(specs[i].arg, "name", None) == value.name:
                specs[i].arg.name = separate.name
            count += 1
        seen.add(value)
    if count:
        output.args = (type(output.args[0])(values), *output.args[1:])
        program.graph_module.recompile()
    return count


def constant_outputs_as_none(program: Any) -> int:
    """Replace the numbers, strings and booleans among ``program``'s graph outputs by ``None``, in place; returns
    how many. torch.onnx and OpenVINO's frontend convert a program that returns a Python number (MaskFormer Swin's
    spatial sizes) only this way: each skips a ``None`` output; the export's metadata keeps the constants
    (``out_constants``) for the runners to put back."""
    module = program.graph_module
    output = next(n for n in module.graph.nodes if n.op == "output")
    values = output.args[0]
    if not isinstance(values, (tuple, list)):
        return 0
    constant = [v is not None and not isinstance(v, torch.fx.Node) for v in values]
    if not any(constant):
        return 0
    output.args = (type(values)(None if c else v for c, v in zip(constant, values)),)
    module.recompile()
    return sum(constant)
