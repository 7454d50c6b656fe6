"""Read the typed I/O signature of an ``ExportedProgram`` into :class:`~hfexport.metadata.ExportMetadata`.

Every backend starts from a ``torch.export`` program, so this is the one place that maps torch's graph signature
(``USER_INPUT``, ``USER_INPUT_MUTATION``, ...) onto our roles and pytree names.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Mapping
from typing import Any

import sympy
import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind

from .metadata import CacheLeaf, ExportMetadata, IORole, KwargSpec, LeafRole, TensorSpec, json_constant, shape_of
from .pytrees import cache_leaf_owners, dump_spec, flatten_with_names, is_cache, spec_leaf_names

__all__ = ["build_export_metadata", "cache_leaves"]

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


#: what a cache layer's attribute holds, by the attribute's name in transformers' cache_utils layer classes
_LEAF_ROLES = {
    "keys": LeafRole.KEYS, "values": LeafRole.VALUES,
    "cumulative_length": LeafRole.COUNTER, "indexer_cumulative_length": LeafRole.COUNTER,
    "conv_states": LeafRole.RECURRENT, "recurrent_states": LeafRole.RECURRENT, "ssm_states": LeafRole.RECURRENT,
}


def _layer_classes() -> tuple[type, ...]:
    import transformers.cache_utils as cache_utils

    names = ("CacheLayerMixin", "LinearAttentionCacheLayerMixin")
    return tuple(getattr(cache_utils, n) for n in names if hasattr(cache_utils, n))


def cache_leaves(kwarg: str, cache: Any) -> list[CacheLeaf]:
    """Where each tensor of ``cache`` sits (in its flat order): the layer holding it, that layer's class, whether
    it is static, the sub-cache, and the role its attribute has in that layer class. Read from the objects."""
    from transformers.cache_utils import StaticLayer

    layers = _layer_classes()
    out = []
    for path, owners in cache_leaf_owners(cache):
        at, layer = next(((p, o) for p, o in reversed(owners) if isinstance(o, layers)), ((), None))
        index = at[-1] if at and isinstance(at[-1], int) else None  # its place in a `layers` list
        # a cache inside the cache (EncoderDecoderCache's self_attention_cache / cross_attention_cache)
        part = next((p[0] for p, o in owners[1:] if is_cache(o)), None)
        out.append(CacheLeaf(
            kwarg=kwarg, role=_LEAF_ROLES.get(path[-1], LeafRole.OTHER) if layer is not None else LeafRole.OTHER,
            layer=index, layer_type=type(layer).__name__ if layer is not None else None,
            static=isinstance(layer, StaticLayer), part=part,
        ))
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
    assumptions: list[str] | None = None,
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
        assumptions: What the program's last outputs check (:func:`~hfexport.capture.assumptions.assumptions_as_outputs`,
            whose output tree is ``(model outputs, checks)``): those outputs get :attr:`IORole.CHECK`.
    """
    named_inputs, in_spec = flatten_with_names(dict(inputs))
    tensor_inputs, in_constants, by_placeholder = _input_specs(program, model, inputs, named_inputs)
    assumptions = list(assumptions or [])
    out_spec = program.call_spec.out_spec.children()[0] if assumptions else program.call_spec.out_spec
    outputs, out_constants = _output_specs(program, by_placeholder, out_spec, len(assumptions))
    kwargs_info = {key: KwargSpec.of(value) for key, value in inputs.items()}
    for key, value in (flags or {}).items():
        kwargs_info[key] = KwargSpec.flag()
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
        dim_ranges=_dim_ranges(program, tensor_inputs),
        assumptions=assumptions,
    )


def _dim_ranges(program: torch.export.ExportedProgram, specs: list[TensorSpec]) -> dict[str, list]:
    """``[lower, upper]`` of each symbol in the inputs' shapes, from the program's range constraints (upper None:
    unbounded)."""
    symbols = {d for s in specs for d in s.shape if isinstance(d, str)}
    out: dict[str, list] = {}
    for symbol, bounds in program.range_constraints.items():
        if str(symbol) in symbols:
            upper = bounds.upper  # torch's int_oo (unbounded) is no sympy Integer
            out[str(symbol)] = [int(bounds.lower), int(upper) if isinstance(upper, sympy.Integer) else None]
    return out


def _leaf_places(inputs: Mapping[str, Any], count: int) -> list[CacheLeaf | None]:
    """Each flat input leaf's place in its cache (None outside a cache), in flat order: the kwargs flatten one
    after the other."""
    places: list[CacheLeaf | None] = []
    for key, value in inputs.items():
        leaves = len(flatten_with_names(value)[0])
        if not is_cache(value):
            places += [None] * leaves
            continue
        found = cache_leaves(key, value)
        # a cache class flattened by its own registration (not ours): its leaves' places are not known
        places += found if len(found) == leaves else [CacheLeaf(key, LeafRole.OTHER)] * leaves
    if len(places) != count:
        raise RuntimeError(f"the inputs flatten to {count} leaves, their kwargs one by one to {len(places)}")
    return places


def _input_specs(
    program: torch.export.ExportedProgram, model: torch.nn.Module, inputs: Mapping[str, Any],
    named_inputs: list[tuple[str, Any]],
) -> tuple[list[TensorSpec], dict[str, Any], dict[str, TensorSpec]]:
    """The tensor inputs' specs in the program's order, the constant inputs' values, and the specs by placeholder."""
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    user_specs = [s for s in program.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    if len(user_specs) != len(named_inputs):
        raise RuntimeError(
            f"graph has {len(user_specs)} user inputs but the inputs flatten to {len(named_inputs)} leaves"
        )
    weights_device = next((p.device for p in model.parameters()), torch.device("cpu"))
    tensor_inputs: list[TensorSpec] = []
    in_constants: dict[str, Any] = {}
    by_placeholder: dict[str, TensorSpec] = {}
    for (name, leaf), spec, place in zip(named_inputs, user_specs, _leaf_places(inputs, len(named_inputs))):
        if isinstance(spec.arg, ConstantArgument) or not isinstance(leaf, torch.Tensor):
            in_constants[name] = json_constant(leaf)
            continue
        val = placeholders[spec.arg.name].meta.get("val", leaf)
        ts = TensorSpec(
            name=name, role=IORole.CACHE_INPUT if place is not None else IORole.INPUT, dtype=_dtype_name(val.dtype),
            shape=shape_of(val), example_shape=list(leaf.shape),
            device=str(leaf.device) if leaf.device != weights_device else None, cache=place,
        )
        tensor_inputs.append(ts)
        by_placeholder[spec.arg.name] = ts
    for placeholder in inplace_mutated_placeholders(program.graph):
        if placeholder in by_placeholder:
            by_placeholder[placeholder].mutated = True
    return tensor_inputs, in_constants, by_placeholder


def _output_specs(
    program: torch.export.ExportedProgram, by_placeholder: dict[str, TensorSpec], out_spec: Any, checks: int
) -> tuple[list[TensorSpec], list]:
    """The outputs' specs in the program's order (user outputs, in-place updates of inputs, buffer updates, the
    ``checks`` assumption outputs last), and the constant user outputs as ``[index, value]``."""
    user_names = spec_leaf_names(out_spec) + [(f"assumption.{i}", False) for i in range(checks)]
    values = list(program.graph.output_node().args[0])
    outputs: list[TensorSpec] = []
    out_constants: list = []
    user_index = 0
    for spec, node in zip(program.graph_signature.output_specs, values):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if spec.kind == OutputKind.USER_OUTPUT:
            name, in_cache = user_names[user_index]
            if isinstance(spec.arg, ConstantArgument) or val is None or not isinstance(val, torch.Tensor):
                out_constants.append([user_index, json_constant(getattr(spec.arg, "value", None))])
            else:
                role = IORole.CACHE_OUTPUT if in_cache else IORole.OUTPUT
                if user_index >= len(user_names) - checks:
                    role = IORole.CHECK
                outputs.append(TensorSpec(name=name, role=role, dtype=_dtype_name(val.dtype), shape=shape_of(val)))
            user_index += 1
        elif spec.kind == OutputKind.USER_INPUT_MUTATION:
            target = by_placeholder[spec.target]
            target.mutated = True
            outputs.append(TensorSpec(name=target.name, role=IORole.MUTATION, dtype=_dtype_name(val.dtype),
                                      shape=shape_of(val), target=target.name))
        elif spec.kind == OutputKind.BUFFER_MUTATION:
            outputs.append(TensorSpec(name=f"buffer.{spec.target}", role=IORole.STATE, dtype=_dtype_name(val.dtype),
                                      shape=shape_of(val), target=spec.target))
        else:
            raise RuntimeError(f"unsupported output kind {spec.kind} in the exported graph")
    return outputs, out_constants
