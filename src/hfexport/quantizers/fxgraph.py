"""FX-graph quantizers work on a ``GraphModule``; the backends take an ``ExportedProgram``: go there and back.

:func:`graph_module` gives the program's module (what PT2E and NNCF quantize); :func:`reexport` traces the quantized
module again with the program's own example inputs and the same dims symbolic, so the backend gets a program with
the signature (in-place cache writes included) of the one it traced.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.export import Dim, ShapesCollection

from ..pytrees import tensor_leaves

__all__ = ["graph_module", "reexport", "traced_keys", "drop_unused_weights", "module_path", "module_paths"]


def module_path(node: torch.fx.Node) -> str:
    """The path of the innermost module that called ``node`` (``model.layers.0.mlp.down_proj``), or ``""``."""
    import re

    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return re.sub(r"^L\['self'\]\.?|^L__self__\.?", "", str(path))


def module_paths(program: torch.export.ExportedProgram) -> dict[str, str]:
    """Each FX node's name -> :func:`module_path`: what a quantizer of the converted model reads the modules from
    (OpenVINO's frontend names each op after its FX node)."""
    return {node.name: module_path(node) for node in program.graph.nodes}


def graph_module(program: torch.export.ExportedProgram) -> torch.fx.GraphModule:
    """The program as a callable ``GraphModule`` taking the traced kwargs."""
    return program.module()


def traced_keys(program: torch.export.ExportedProgram) -> list[str]:
    """The kwargs the program was traced with, in order."""
    _, kwargs = program.example_inputs
    return list(kwargs)


def reexport(
    program: torch.export.ExportedProgram, module: torch.fx.GraphModule, drop_unused: bool = True
) -> torch.export.ExportedProgram:
    """``torch.export`` the quantized ``module`` on ``program``'s example inputs, keeping its symbolic dims;
    ``drop_unused`` first deletes the weights the quantizer replaced (:func:`drop_unused_weights`).

    Never strict: Dynamo refuses to trace an exported ``GraphModule``, and no Python is left to check.
    """
    args, kwargs = program.example_inputs
    if drop_unused:
        drop_unused_weights(module)
    shapes = _dynamic_shapes(program, module, args, kwargs)
    with torch.no_grad():
        return torch.export.export(
            module,
            args=tuple(args),
            kwargs=_fresh(kwargs),
            dynamic_shapes=shapes,
            strict=False,
            prefer_deferred_runtime_asserts_over_guards=True,
        )


def _fresh(kwargs: dict[str, Any]) -> dict[str, Any]:
    """A copy of the example inputs (the re-trace must not write into the program's own)."""
    import copy

    return copy.deepcopy(kwargs)


def _dynamic_shapes(
    program: torch.export.ExportedProgram, module: torch.nn.Module, args: Any, kwargs: dict[str, Any]
) -> Any:
    """Mark, on the example inputs' tensors, the dims the program keeps symbolic (``Dim.AUTO``)."""
    user_inputs = [
        node
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in set(program.graph_signature.user_inputs)
    ]
    tensors = tensor_leaves((args, kwargs))
    values = [node.meta.get("val") for node in user_inputs]
    values = [v for v in values if isinstance(v, torch.Tensor)]
    if len(tensors) != len(values):
        return None  # unexpected layout: re-trace static rather than guess
    collection = ShapesCollection()
    dynamic = False
    for tensor, value in zip(tensors, values):
        dims = {i: Dim.AUTO for i, size in enumerate(value.shape) if not isinstance(size, int)}
        if dims:
            collection[tensor] = dims
            dynamic = True
    if not dynamic:
        return None
    return collection.dynamic_shapes(module, tuple(args), kwargs)


def drop_unused_weights(module: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Delete the parameters and buffers no ``get_attr`` node reads any more (in place; returns ``module``).

    A quantizer replaces each fp32 weight by an int8 constant but leaves the fp32 tensor on the module, and
    ``torch.export`` keeps every parameter and buffer of the module it traces, used or not: without this the
    quantized program would store the fp32 weights too.
    """
    used = {node.target for node in module.graph.nodes if node.op == "get_attr"}
    called = {node.target for node in module.graph.nodes if node.op == "call_module"}  # e.g. NNCF decompressors
    for name, _ in [*module.named_parameters(remove_duplicate=False), *module.named_buffers(remove_duplicate=False)]:
        if name in used or any(name.startswith(f"{prefix}.") for prefix in called):
            continue
        owner_path, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        if attr in owner._parameters:
            del owner._parameters[attr]
        elif attr in owner._buffers:
            del owner._buffers[attr]
    return module
