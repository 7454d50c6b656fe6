"""Passes over a traced program that every backend's lowering may need before its own converter."""

from __future__ import annotations

from collections.abc import Iterator

import torch

__all__ = ["drop_tensor_checks", "program_graphs"]

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
    order = {node: i for i, node in enumerate(graph.nodes)}
    removed = 0
    for root in [n for n in graph.nodes if n.op == "call_function" and n.target == torch.ops.aten._is_all_true.default]:
        chain, todo = {root}, [root]
        while todo:
            for user in todo.pop().users:
                if user not in chain:
                    chain.add(user)
                    todo.append(user)
        if any(not n.users and n.target not in _ASSERTS for n in chain):
            continue  # the condition feeds something besides the checks
        for node in sorted(chain, key=order.__getitem__, reverse=True):
            graph.erase_node(node)
        removed += 1
    if removed:
        program.graph_module.recompile()
    return removed


_ASSERTS = (torch.ops.aten._assert_scalar.default, torch.ops.aten._assert_async.msg, torch.ops.aten._assert_async.default)


def program_graphs(program: torch.export.ExportedProgram) -> Iterator[tuple[torch.nn.Module, torch.fx.Graph]]:
    """Every FX graph of ``program`` with the module that holds it: the top graph and its submodules' (the bodies of
    control flow), for passes that rewrite nodes wherever they are (recompile the module after a change)."""
    for module in program.graph_module.modules():
        graph = getattr(module, "graph", None)
        if isinstance(graph, torch.fx.Graph):
            yield module, graph

