"""A traced program's runtime assertions turned into boolean outputs, for runtimes that drop assertions.

A program traced on the sample's branch of a data-dependent guard (:mod:`.trace`) holds its assumptions as
``aten._assert_scalar`` nodes over symbolic scalars (``u0 = x.item()``; ``Ne(u0, 1)``). ONNX, OpenVINO and ExecuTorch
lower the program without them (and OpenVINO's frontend has no conversion for the symbolic ``operator.eq`` /
``sym_not`` / ``sym_ite`` that compute them). :func:`assumptions_as_outputs` computes each condition again with
tensor ops (``item()`` read back as its 0-d tensor, ``operator.eq`` as ``aten.eq``, ``sym_ite`` as ``aten.where``)
and returns it as one more output of the program, after the model's own; the runner checks them after each call
(:meth:`hfexport.runner.ModelRunner.checked`) and refuses an input that took another branch, naming the assumption.
The program's output tree becomes ``(model outputs, (check, ...))``; the metadata records the model's own tree and
the assumptions (:func:`hfexport.signature.build_export_metadata`).

Written here because torch's own passes go the other way (``insert_deferred_runtime_asserts`` builds the
assertions, ``RemoveGraphAssertsPass`` / the ONNX exporter drop them); none turns them into outputs.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import torch
from torch.export.graph_signature import OutputKind, OutputSpec, TensorArgument
from torch.utils import _pytree as pytree

__all__ = ["assumption_text", "assumptions_as_outputs", "assumptions_of", "fake_mode_of"]

aten = torch.ops.aten
_ASSERT = aten._assert_scalar.default

# symbolic scalar op -> the tensor op that computes it on 0-d tensors
_TENSOR_OPS: dict[Any, Any] = {
    operator.eq: aten.eq.Tensor, operator.ne: aten.ne.Tensor, operator.ge: aten.ge.Tensor, operator.gt: aten.gt.Tensor,
    operator.le: aten.le.Tensor, operator.lt: aten.lt.Tensor, operator.add: aten.add.Tensor,
    operator.sub: aten.sub.Tensor, operator.mul: aten.mul.Tensor, operator.floordiv: aten.floor_divide.default,
    operator.mod: aten.remainder.Tensor, operator.and_: aten.logical_and.default, operator.or_: aten.logical_or.default,
    torch.sym_not: aten.logical_not.default, torch.sym_max: aten.maximum.default, torch.sym_min: aten.minimum.default,
    torch.sym_ite: aten.where.self,
}
_ITEM = (aten._local_scalar_dense.default, aten.item.default)
_ALL_TRUE = aten._is_all_true.default
_OFFSET = aten.sym_storage_offset.default


def assumption_text(node: torch.fx.Node) -> str:
    """The expression an ``_assert_scalar`` node asserts (``Ne(u0, 1)``), from its message."""
    message = node.args[1] if len(node.args) > 1 and isinstance(node.args[1], str) else str(node.args[0])
    return message.split("for expression ", 1)[-1].split(" on node ", 1)[0]


def assumptions_of(program: Any) -> list[str]:
    """The data-dependent expressions a program asserts at run time (``u0 <= 1``, ``Ne(u0, 1)``), in graph order."""
    return [assumption_text(n) for n in program.graph.nodes if n.target is _ASSERT]


def fake_mode_of(program: Any) -> Any:
    """The fake mode the program was traced under (from its placeholders' values), or ``None``."""
    values = [n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"]
    return torch._guards.detect_fake_mode([v for v in values if v is not None])


def assumptions_as_outputs(program: torch.export.ExportedProgram) -> list[str]:
    """Replace each ``_assert_scalar`` of ``program`` by a boolean 0-d output computed with tensor ops, in place;
    return the assumptions in output order (see the module's docstring)."""
    graph = program.graph_module.graph
    asserts = [n for n in graph.nodes if n.op == "call_function" and n.target is _ASSERT]
    if not asserts:
        return []
    fake_mode = fake_mode_of(program)
    output = graph.output_node()
    tensors: dict[torch.fx.Node, torch.fx.Node] = {}
    checks, texts = [], []
    for node in asserts:
        if _holds_always(node.args[0]):
            graph.erase_node(node)
            continue
        with graph.inserting_before(output):
            check = _as_tensor(graph, node.args[0], tensors, fake_mode)
            if check.meta["val"].dtype != torch.bool:
                check = _call(graph, aten.ne.Scalar, (check, 0), fake_mode)
        checks.append(check)
        texts.append(assumption_text(node))
        graph.erase_node(node)
    _erase_dead_scalars(graph)
    if not checks:
        graph.lint()
        program.graph_module.recompile()
        return []
    output.args = ((*output.args[0], *checks),)
    program.graph_signature.output_specs.extend(
        OutputSpec(OutputKind.USER_OUTPUT, TensorArgument(c.name), None) for c in checks)
    own = program.call_spec.out_spec
    flags = pytree.tree_flatten(tuple(range(len(checks))))[1]
    program._module_call_graph[0].signature.out_spec = pytree.TreeSpec(tuple, None, [own, flags])
    graph.lint()
    program.graph_module.recompile()
    return texts


def _call(graph: torch.fx.Graph, target: Any, args: tuple, fake_mode: Any, kwargs: dict | None = None) -> Any:
    values = [a.meta["val"] if isinstance(a, torch.fx.Node) else a for a in args]
    with fake_mode:
        value = target(*values, **(kwargs or {}))
    node = graph.call_function(target, args, kwargs or {})
    node.meta["val"] = value
    return node


def _constant(graph: torch.fx.Graph, value: Any, fake_mode: Any) -> torch.fx.Node:
    dtype = torch.bool if isinstance(value, bool) else torch.int64 if isinstance(value, int) else torch.float32
    if isinstance(value, float) and math.isinf(value):
        value = torch.finfo(torch.float32).max if value > 0 else torch.finfo(torch.float32).min
    return _call(graph, aten.scalar_tensor.default, (value,), fake_mode, {"dtype": dtype})


def _as_tensor(graph: torch.fx.Graph, arg: Any, tensors: dict, fake_mode: Any) -> torch.fx.Node:
    """A 0-d tensor node that computes the symbolic scalar ``arg`` (a node or a Python constant)."""
    if not isinstance(arg, torch.fx.Node):
        return _constant(graph, arg, fake_mode)
    if arg in tensors:
        return tensors[arg]
    if arg.op == "call_function" and arg.target in _ITEM:
        source = arg.args[0]
        if isinstance(source, torch.fx.Node) and source.target is _ALL_TRUE:  # torch._check_tensor_all's reduction
            result = _call(graph, aten.all.default, (source.args[0],), fake_mode)  # (not core ATen, no ONNX function)
        else:
            result = _call(graph, aten.reshape.default, (source, []), fake_mode)
    elif arg.op == "call_function" and arg.target in _TENSOR_OPS:
        operands = [_as_tensor(graph, a, tensors, fake_mode) for a in arg.args]
        result = _call(graph, _TENSOR_OPS[arg.target], tuple(operands), fake_mode)
    else:  # a size (sym_size) or another symbolic leaf: the runtime's own scalar
        value = arg.meta.get("val")
        dtype = torch.bool if isinstance(value, torch.SymBool) else torch.float32 if isinstance(
            value, torch.SymFloat) else torch.int64
        result = _call(graph, aten.scalar_tensor.default, (arg,), fake_mode, {"dtype": dtype})
    tensors[arg] = result
    return result


def _holds_always(condition: Any) -> bool:
    """``storage_offset(x) >= 0``: torch asserts it of a slice that starts at a data-dependent index (MiniCPM-V's
    ``hidden_states[0, start : start + n]``); it holds for every tensor, and the runtimes these programs go to have no
    storage offset to compute it from (OpenVINO's frontend: no conversion rule for ``aten.sym_storage_offset``)."""
    return (isinstance(condition, torch.fx.Node) and condition.target is operator.ge
            and isinstance(condition.args[0], torch.fx.Node) and condition.args[0].target is _OFFSET
            and condition.args[1] == 0)


def _erase_dead_scalars(graph: torch.fx.Graph) -> None:
    """Erase the symbolic scalars (and ``item()`` reads) nothing uses any more, last first."""
    for node in reversed(list(graph.nodes)):
        if node.op != "call_function" or node.users:
            continue
        if node.target in _TENSOR_OPS or node.target in _ITEM or node.target in (_ALL_TRUE, _OFFSET):
            graph.erase_node(node)
