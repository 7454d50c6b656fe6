"""Read the typed I/O signature of an ``ExportedProgram`` into :class:`~hfexport.metadata.ExportMetadata`.

Every backend starts from a ``torch.export`` program, so this is the one place that maps torch's graph signature
(``USER_INPUT``, ``USER_INPUT_MUTATION``, ...) onto our roles and pytree names.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind

from .capture.caches import context_slot_names, is_cache
from .metadata import (
    ExportMetadata,
    IORole,
    TensorSpec,
    describe_kwargs,
    dump_spec,
    flatten_with_names,
    json_constant,
    shape_of,
)

__all__ = ["build_export_metadata", "output_names"]

_CORE_PACKAGES = ("torch", "transformers")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _package_versions(names: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def output_names(out_spec: pytree.TreeSpec) -> list[tuple[str, bool]]:
    """``(name, in_cache)`` for each leaf of an output spec, in flat order, read from the spec alone."""
    out: list[tuple[str, bool]] = []

    def join(prefix: str, key: Any) -> str:
        return f"{prefix}.{key}" if prefix else str(key)

    def walk(spec: pytree.TreeSpec, prefix: str, in_cache: bool) -> None:
        if spec.is_leaf():
            out.append((prefix, in_cache))
            return
        children = spec.children()
        if is_cache(spec.type):
            keys: list[Any] = context_slot_names(spec.context)
            in_cache = True
        elif isinstance(spec.context, list) and len(spec.context) == len(children):
            keys = spec.context  # dict / ModelOutput keys
        elif hasattr(spec.context, "_fields"):
            keys = list(spec.context._fields)  # namedtuple
        else:
            keys = list(range(len(children)))
        for key, child in zip(keys, children):
            walk(child, join(prefix, key), in_cache)

    walk(out_spec, "", False)
    return out


def _root(node: Any) -> Any:
    """Follow views back to the tensor they alias."""
    while (
        isinstance(node, torch.fx.Node)
        and node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target._schema.returns
        and node.target._schema.returns[0].alias_info is not None
        and node.args
    ):
        node = node.args[0]
    return node


def inplace_mutated_placeholders(graph: torch.fx.Graph) -> set[str]:
    """Placeholders written in place by the graph (``torch.export`` keeps in-place ops unless decomposed)."""
    mutated: set[str] = set()
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        for i, arg in enumerate(node.target._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            root = _root(value)
            if isinstance(root, torch.fx.Node) and root.op == "placeholder":
                mutated.add(root.name)
    return mutated


def build_export_metadata(
    program: torch.export.ExportedProgram,
    model: torch.nn.Module,
    inputs: Mapping[str, Any],
    config: Any,
    *,
    packages: tuple[str, ...] = (),
    workarounds: list[str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> ExportMetadata:
    """The metadata of one traced graph: spec fields, tree specs and the typed flat signature.

    Args:
        program: The ``ExportedProgram`` traced from ``model(**inputs)``.
        model: The module that was traced.
        inputs: The kwargs it was traced with, in the traced order.
        config: The export config (saved as its dict).
        packages: Backend packages whose versions to record besides torch and transformers.
        workarounds: Ids of the workarounds that fired.
        flags: Output flags (``use_cache``, ...) applied to the config during the trace; recorded as constants.
    """
    named_inputs, in_spec = flatten_with_names(dict(inputs))
    cache_kwargs = {k for k, v in inputs.items() if is_cache(v)}
    sig = program.graph_signature
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}

    user_specs = [s for s in sig.input_specs if s.kind == InputKind.USER_INPUT]
    if len(user_specs) != len(named_inputs):
        raise RuntimeError(
            f"graph has {len(user_specs)} user inputs but the inputs flatten to {len(named_inputs)} leaves"
        )
    weights_device = next((p.device for p in model.parameters()), torch.device("cpu"))
    tensor_inputs: list[TensorSpec] = []
    in_constants: dict[str, Any] = {}
    by_placeholder: dict[str, TensorSpec] = {}
    for (name, leaf), spec in zip(named_inputs, user_specs):
        if isinstance(spec.arg, ConstantArgument) or not isinstance(leaf, torch.Tensor):
            in_constants[name] = json_constant(leaf)
            continue
        val = placeholders[spec.arg.name].meta.get("val", leaf)
        role = IORole.CACHE_INPUT if name.split(".")[0] in cache_kwargs else IORole.INPUT
        ts = TensorSpec(
            name=name, role=role, dtype=_dtype_name(val.dtype), shape=shape_of(val), example_shape=list(leaf.shape),
            device=str(leaf.device) if leaf.device != weights_device else None,
        )
        tensor_inputs.append(ts)
        by_placeholder[spec.arg.name] = ts

    for placeholder in inplace_mutated_placeholders(program.graph):
        if placeholder in by_placeholder:
            by_placeholder[placeholder].mutated = True

    out_spec = program.call_spec.out_spec
    user_names = output_names(out_spec)
    output_node = program.graph.output_node()
    values = list(output_node.args[0])
    outputs: list[TensorSpec] = []
    out_constants: list = []
    user_index = 0
    for spec, node in zip(sig.output_specs, values):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if spec.kind == OutputKind.USER_OUTPUT:
            name, in_cache = user_names[user_index]
            if isinstance(spec.arg, ConstantArgument) or val is None or not isinstance(val, torch.Tensor):
                out_constants.append([user_index, json_constant(getattr(spec.arg, "value", None))])
            else:
                role = IORole.CACHE_OUTPUT if in_cache else IORole.OUTPUT
                outputs.append(TensorSpec(name=name, role=role, dtype=_dtype_name(val.dtype), shape=shape_of(val)))
            user_index += 1
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            target = by_placeholder[spec.target]
            target.mutated = True
            outputs.append(
                TensorSpec(
                    name=f"{target.name}",
                    role=IORole.MUTATION,
                    dtype=_dtype_name(val.dtype),
                    shape=shape_of(val),
                    target=target.name,
                )
            )
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            outputs.append(
                TensorSpec(
                    name=f"buffer.{spec.target}",
                    role=IORole.STATE,
                    dtype=_dtype_name(val.dtype),
                    shape=shape_of(val),
                    target=spec.target,
                )
            )
        else:
            raise RuntimeError(f"unsupported output kind {spec.kind} in the exported graph")

    kwargs_info = describe_kwargs(inputs)
    for key, value in (flags or {}).items():
        kwargs_info[key] = {"kind": "flag"}
        in_constants[key] = json_constant(value)

    dtype = next((p.dtype for p in model.parameters()), None)
    device = next((p.device for p in model.parameters()), None)
    model_config = getattr(model, "config", None)
    architectures = getattr(model_config, "architectures", None) or [type(model).__name__]
    return ExportMetadata(
        architecture=architectures[0] if type(model).__name__ in architectures else type(model).__name__,
        packages=_package_versions((*_CORE_PACKAGES, *packages)),
        export_config=config.to_dict() if hasattr(config, "to_dict") else dict(config or {}),
        export_dtype=_dtype_name(dtype) if dtype is not None else None,
        export_device=str(device) if device is not None else None,
        kwargs=kwargs_info,
        in_spec=dump_spec(in_spec),
        out_spec=dump_spec(out_spec),
        in_constants=in_constants,
        out_constants=out_constants,
        inputs=tensor_inputs,
        outputs=outputs,
        workarounds=list(workarounds or []),
    )
