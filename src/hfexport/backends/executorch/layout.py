"""The flat outputs of a lowered program, as the typed signature: what ``Method.execute`` returns, in its order.

``torch.export`` keeps a static cache's in-place write as an in-place op; the edge dialect functionalises it, so the
``.pte`` returns the new value of every cache tensor it updates (``USER_INPUT_MUTATION``) before the model's own
outputs. The metadata recorded while tracing is rewritten here to list them, each naming the input it updates, so
the runner can write them back without parsing any name.
"""

from __future__ import annotations

from typing import Any

from torch.export.graph_signature import ConstantArgument, InputKind, OutputKind, TensorArgument

from ...metadata import ExportMetadata, IORole, TensorSpec, json_constant, shape_of

__all__ = ["record_program_outputs"]


def _record_fixed_sizes(by_placeholder: dict[str, TensorSpec], nodes: dict[str, Any]) -> None:
    """A size that lowering fixed (a pass guarding a symbolic size to its traced value: ExecuTorch's arg validator
    re-running a MoE routing) is recorded as fixed, so the metadata says what the program takes (the exporter's
    checks and generate() read it) rather than what the trace took."""
    for name, spec in by_placeholder.items():
        val = nodes[name].meta.get("val") if name in nodes else None
        if val is None or len(val.shape) != len(spec.shape):
            continue
        spec.shape = [fixed if isinstance(fixed, int) and isinstance(dim, str) else dim
                      for dim, fixed in zip(spec.shape, shape_of(val))]


def record_program_outputs(manager: Any, metadata: ExportMetadata, method: str = "forward", state: Any = None) -> None:
    """Set ``metadata.outputs`` to the outputs of ``manager``'s ``method``, in the program's order, in place.

    ``state`` (a :class:`~.state.FoldedState`): the cache inputs kept as buffers get the ``STATE`` role and their
    buffer's name as ``target``; the returned cache's tensors, which the program no longer returns, leave the list.
    """
    if state is not None:
        for index, name in state.inputs.items():
            metadata.inputs[index].role = IORole.STATE
            metadata.inputs[index].target = name
    signature = manager.exported_program(method).graph_signature
    every_user_input = [s for s in signature.input_specs if s.kind == InputKind.USER_INPUT]
    metadata.program_constants = [[slot, json_constant(s.arg.value)] for slot, s in enumerate(every_user_input)
                                  if isinstance(s.arg, ConstantArgument)]
    user_inputs = [s for s in every_user_input if isinstance(s.arg, TensorArgument)]
    fed = [spec for spec in metadata.inputs if spec.role is not IORole.STATE]
    if len(user_inputs) != len(fed):
        raise RuntimeError(
            f"the lowered program takes {len(user_inputs)} tensor inputs, the traced one {len(metadata.inputs)}"
        )
    by_placeholder = {s.arg.name: spec for s, spec in zip(user_inputs, fed)}
    program = manager.exported_program(method)
    nodes = {n.name: n for n in program.graph.nodes}
    _record_fixed_sizes(by_placeholder, nodes)
    dropped = state.dropped_outputs if state is not None else set()
    buffers = set(state.inputs.values()) if state is not None else set()
    user = iter([*(s for i, s in enumerate(metadata.user_outputs) if i not in dropped), *metadata.checks])
    outputs = []
    for spec in signature.output_specs:
        node = nodes.get(getattr(spec.arg, "name", None))
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            target = by_placeholder[spec.target]
            target.mutated = True
            outputs.append(TensorSpec(name=target.name, role=IORole.MUTATION, dtype=target.dtype,
                                      shape=list(target.shape), target=target.name))
        elif spec.kind == OutputKind.BUFFER_MUTATION and spec.target in buffers:
            continue  # a folded cache tensor: updated inside the method, not returned
        elif spec.kind == OutputKind.BUFFER_MUTATION:  # the program returns a buffer it updates, too
            val = node.meta.get("val") if hasattr(node, "meta") else None
            outputs.append(TensorSpec(name=f"buffer.{spec.target}", role=IORole.STATE,
                                      dtype=str(val.dtype).removeprefix("torch.") if val is not None else "float32",
                                      shape=shape_of(val) if val is not None else [], target=spec.target))
        elif spec.kind == OutputKind.USER_OUTPUT:
            if isinstance(spec.arg, TensorArgument):  # a constant (None, an int) is in metadata.out_constants
                outputs.append(next(user))
        else:
            raise RuntimeError(f"unsupported output kind {spec.kind} in the lowered program")
    metadata.outputs = outputs
