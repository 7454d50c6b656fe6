"""A static KV cache kept inside the ``.pte`` as mutable buffers, instead of going in and out at every call.

A traced static cache is a set of user inputs the graph updates in place (``USER_INPUT_MUTATION``). Run that way,
each decode step copies every cache tensor into the method's arena, copies it out again as an output (twice: as
the mutation and as the model's returned cache) and writes it back into the caller's tensors: on SmolLM2-135M
with a 256-slot cache, 60 tensors of 196 KB, several times per token. :func:`fold_cache_state` turns the cache's
key and value inputs of a traced program into non-persistent buffers (``BUFFER`` / ``BUFFER_MUTATION``), so the
ExecuTorch memory plan keeps them in the method between calls and the cache update happens in place there. Their
outputs in the model's returned cache are dropped from the program: the runner returns the caller's cache object,
which stands for the state (see :class:`~.runner.ExecutorchRunner`). Each buffer is named after its input's placeholder
(``past_key_values_layers_0_keys``), and ``to_executorch`` emits the names, so the runner reaches the live tensors with
``Method.get_attribute`` (to load a new sequence's cache, or to read the state back).

The cache's write counters (``cumulative_length``) stay inputs: they are scalars, and the caller's cache object
keeps counting, so a fresh cache (counter 0) starts a new sequence. On the llama custom-op path (.custom_sdpa) they
are kept as state too, and the runner copies them back into the caller's cache after each call.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    OutputKind,
    OutputSpec,
    TensorArgument,
)

from ...metadata import ExportMetadata, LeafRole
from ...pytrees import is_cache

__all__ = ["FoldedState", "fold_cache_state", "keeps_cache_state"]

_STATE_LEAVES = (LeafRole.KEYS, LeafRole.VALUES)


def keeps_cache_state(config: Any, inputs: Mapping[str, Any]) -> bool:
    """Whether an export keeps its static cache as state: XNNPACK, a ``StaticCache`` input, and the default
    ``alloc_graph_input=True`` (with ``False`` the caller's cache buffers are the program's inputs, updated in
    place: the spec's zero-copy C++ loop, examples/executorch_cpp)."""
    if config.backend != "xnnpack" or not config.alloc_graph_input:
        return False
    return any(type(v).__name__ == "StaticCache" for v in inputs.values() if is_cache(v))


@dataclasses.dataclass
class FoldedState:
    """What :func:`fold_cache_state` did: the flat user-input indices now kept as buffers (index -> buffer name)
    and the flat user-output indices dropped (the returned cache's tensors)."""

    inputs: dict[int, str]
    dropped_outputs: set[int]


def fold_cache_state(
    program: torch.export.ExportedProgram, metadata: ExportMetadata, leaves: tuple[LeafRole, ...] = _STATE_LEAVES
) -> tuple[torch.export.ExportedProgram, FoldedState | None]:
    """A copy of ``program`` whose static-cache keys/values inputs (updated in place) are mutable buffers, and what
    was folded; ``(program, None)`` when there is nothing to fold. ``leaves``: the roles of the cache leaves folded
    (the write counters too on the custom-op path: ``to_executorch`` misnumbers a user-input mutation beside a buffer
    updated by ``llama::update_cache``, see .custom_sdpa); each input's role is the one ``metadata`` recorded."""
    signature = program.graph_signature
    user_specs = [s for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    tensors = [i for i, s in enumerate(user_specs) if isinstance(s.arg, TensorArgument)]
    if len(tensors) != len(metadata.inputs):
        raise ValueError(f"the program takes {len(tensors)} tensor inputs, its metadata lists {len(metadata.inputs)}")
    places = dict(zip(tensors, (s.cache for s in metadata.inputs)))
    in_cache = [places.get(i) is not None for i in range(len(user_specs))]
    folded: dict[int, str] = {}
    for index, place in places.items():
        # torch.export keeps the cache write as an in-place op (index_copy_) on the placeholder; a functionalised
        # program lists it as a USER_INPUT_MUTATION instead
        if place is not None and place.role in leaves:
            folded[index] = user_specs[index].arg.name
    if not folded:
        return program, None

    graph = _copy_graph(program.graph_module.graph)
    placeholders = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    by_arg = {user_specs[i].arg.name: name for i, name in folded.items()}
    first_user = placeholders[user_specs[0].arg.name]
    constants = dict(program.constants)
    new_inputs, buffers = [], []
    for spec in signature.input_specs:
        if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, TensorArgument) and spec.arg.name in by_arg:
            name = by_arg[spec.arg.name]
            node = placeholders[spec.arg.name]
            if _symbolic(node):
                raise ValueError(f"cannot keep {name} as state: its shape {tuple(node.meta['val'].shape)} is dynamic")
            constants[name] = torch.zeros(node.meta["val"].shape, dtype=node.meta["val"].dtype)
            buffers.append(InputSpec(InputKind.BUFFER, spec.arg, target=name, persistent=False))
            first_user.prepend(node)  # buffers come before the user inputs
        else:
            new_inputs.append(spec)
    position = next(i for i, s in enumerate(new_inputs) if s.kind == InputKind.USER_INPUT)
    new_inputs[position:position] = buffers

    # the returned cache (its tensors are the new values of the cache inputs): dropped, the runner returns the
    # caller's cache object in its place
    cache_inputs = {user_specs[i].arg.name for i in range(len(user_specs)) if in_cache[i]}
    cache_values = {s.arg.name for s in signature.output_specs
                    if s.kind == OutputKind.USER_INPUT_MUTATION and s.target in cache_inputs} | cache_inputs
    output_node = graph.output_node()
    values = list(output_node.args[0])

    def is_cache_value(node: Any) -> bool:  # a cache input, or an in-place write into one
        while isinstance(node, torch.fx.Node) and node.op == "call_function" and _in_place(node):
            node = node.args[0]
        return isinstance(node, torch.fx.Node) and node.name in cache_values

    new_outputs, kept, dropped, user_index = [], [], set(), 0
    for spec, value in zip(signature.output_specs, values):
        if spec.kind == OutputKind.USER_INPUT_MUTATION and spec.target in by_arg:
            new_outputs.append(OutputSpec(OutputKind.BUFFER_MUTATION, spec.arg, target=by_arg[spec.target]))
            kept.append(value)
            continue
        if spec.kind == OutputKind.USER_OUTPUT:
            user_index += 1
            if is_cache_value(value):
                dropped.add(user_index - 1)
                continue
        new_outputs.append(spec)
        kept.append(value)
    # BUFFER_MUTATION outputs come first, then USER_INPUT_MUTATION, then the user outputs
    order = sorted(range(len(new_outputs)), key=lambda i: {OutputKind.BUFFER_MUTATION: 0,
                                                          OutputKind.USER_INPUT_MUTATION: 1}.get(new_outputs[i].kind, 2))
    new_outputs = [new_outputs[i] for i in order]
    kept = [kept[i] for i in order]
    output_node.args = (tuple(kept),)
    graph.eliminate_dead_code()
    gm = torch.fx.GraphModule(program.graph_module, graph)
    # the call signature: the remaining user inputs and outputs, flat (a cache without its tensors has no pytree);
    # its argument lists stay empty, as the names change under the edge decompositions
    user_in = [s.arg for s in new_inputs if s.kind == InputKind.USER_INPUT]
    user_out = [s.arg for s in new_outputs if s.kind == OutputKind.USER_OUTPUT]
    call_graph = [
        dataclasses.replace(entry, signature=dataclasses.replace(
            entry.signature, inputs=[], outputs=[], forward_arg_names=None,
            in_spec=pytree.tree_structure((tuple(range(len(user_in))), {})),
            out_spec=pytree.tree_structure(tuple(range(len(user_out)))),
        )) if entry.fqn == "" and entry.signature is not None else entry
        for entry in program.module_call_graph
    ]
    folded_program = torch.export.ExportedProgram(
        root=gm,
        graph=gm.graph,
        graph_signature=ExportGraphSignature(input_specs=new_inputs, output_specs=new_outputs),
        state_dict=program.state_dict,
        range_constraints=program.range_constraints,
        module_call_graph=call_graph,
        constants=constants,
        verifiers=program.verifiers,
    )
    return folded_program, FoldedState(inputs=folded, dropped_outputs=dropped)


def _in_place(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.is_mutable and bool(node.args)


def _symbolic(node: torch.fx.Node) -> bool:
    return any(isinstance(d, torch.SymInt) for d in node.meta["val"].shape)


def _copy_graph(graph: torch.fx.Graph) -> torch.fx.Graph:
    new = torch.fx.Graph()
    out = new.graph_copy(graph, {})
    new.output(out)
    return new
