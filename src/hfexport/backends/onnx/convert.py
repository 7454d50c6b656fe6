"""``ExportedProgram`` -> ``onnx_ir.Model`` with ``torch.onnx.export``, and the graph's I/O named from the signature."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import io
import logging
import re
import warnings
from typing import Any

import onnx_ir as ir
import onnx_ir.passes.common as common_passes
import torch

from ...capture.graph_passes import drop_tensor_checks
from ...metadata import ExportMetadata
from .names import io_names
from .translations import translation_table

__all__ = ["default_opset", "current_opset", "opset_scope", "to_onnx", "name_graph_io"]

logger = logging.getLogger(__name__)

_opset: contextvars.ContextVar[int | None] = contextvars.ContextVar("hfexport_onnx_opset", default=None)


@functools.cache
def default_opset() -> int:
    """The newest ONNX opset the installed onnxscript has an opset module for (``onnxscript.onnx_opset.opsetN``)."""
    import onnxscript.onnx_opset as opsets

    versions = [int(m.group(1)) for name in dir(opsets) if (m := re.fullmatch(r"opset(\d+)", name))]
    return max(versions)


def current_opset() -> int:
    """The opset of the ONNX export in progress (for workarounds that depend on it), else the default."""
    opset = _opset.get()
    return opset if opset is not None else default_opset()


@contextlib.contextmanager
def opset_scope(opset: int | None):
    """Run an export (trace and conversion) for ``opset``: :func:`current_opset` answers it meanwhile."""
    token = _opset.set(opset if opset is not None else default_opset())
    try:
        yield
    finally:
        _opset.reset(token)


def to_onnx(program: torch.export.ExportedProgram, opset_version: int | None) -> ir.Model:
    """Convert a traced program (dynamo path, torchlib translations); its I/O are named later, once the graph is
    final (:func:`name_graph_io`), since optimisation may merge or bypass the values they name.

    The program is translated as is: ``torch.onnx`` decomposes it for ONNX itself, and functionalises in-place
    updates, so a static cache's new values come out as the user outputs that return the cache.
    """
    opset = opset_version if opset_version is not None else default_opset()
    drop_tensor_checks(program)  # (transformers' traced tensor checks: no ONNX function for aten._is_all_true)
    # torch.onnx prints its progress and warns about missing optional packages (torchvision): keep our output clean
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), _quiet("torch.onnx"):
        warnings.simplefilter("ignore")
        onnx_program = torch.onnx.export(
            program,
            args=(),
            dynamo=True,
            optimize=False,
            opset_version=opset,
            verbose=False,
            custom_translation_table=translation_table(opset),
        )
    model = onnx_program.model
    _drop_debug_metadata(model)
    return model


# per-node debugging records of torch.onnx: 3.5 MB of SmolLM2's 4 MB graph; the module path ("namespace") stays
_DEBUG_KEYS = ("pkg.torch.onnx.stack_trace", "pkg.torch.onnx.fx_node", "pkg.torch.onnx.class_hierarchy")


def _drop_debug_metadata(model: ir.Model) -> None:
    for node in model.graph.all_nodes():
        for key in _DEBUG_KEYS:
            node.metadata_props.pop(key, None)


@contextlib.contextmanager
def _quiet(name: str):
    log = logging.getLogger(name)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def name_graph_io(model: ir.Model, metadata: ExportMetadata) -> None:
    """Name the graph's inputs and outputs as :func:`~.names.io_names` says, in signature order.

    An output that is a graph input, an initializer or an earlier output goes through an ``Identity`` so that each
    output is its own value with its own name. Sizes that a dynamic export left as numeric symbols (``"16"``)
    become plain ints.
    """
    graph = model.graph
    in_names, out_names = io_names(metadata)
    if len(graph.inputs) != len(in_names) or len(graph.outputs) != len(out_names):
        raise RuntimeError(
            f"the ONNX graph has {len(graph.inputs)} inputs and {len(graph.outputs)} outputs, but the signature "
            f"lists {len(in_names)} tensor inputs and {len(out_names)} tensor outputs ({in_names} -> {out_names}); "
            "an input updated in place without being returned cannot be exported to ONNX"
        )
    wanted = set(in_names) | set(out_names)
    for node in graph:
        for value in node.outputs:
            if value.name in wanted:
                value.name = f"{value.name}__inner"
    for value, name in zip(graph.inputs, in_names):
        value.name = name
    seen: set[int] = set()
    for index, name in enumerate(out_names):
        value = graph.outputs[index]
        if value.is_graph_input() or value.is_initializer() or id(value) in seen or value.producer() is None:
            identity = ir.node("Identity", [value])
            identity.outputs[0].shape, identity.outputs[0].type = value.shape, value.type
            graph.append(identity)
            value = identity.outputs[0]
            graph.outputs[index] = value
        seen.add(id(value))
        value.name = name
    for value in (*graph.inputs, *graph.outputs):
        value.shape = _numeric_dims(value.shape)
    common_passes.NameFixPass()(model)


def _numeric_dims(shape: Any) -> Any:
    if shape is None:
        return None
    dims = []
    for d in shape:
        name = getattr(d, "value", d)
        dims.append(int(name) if isinstance(name, str) and name.isdigit() else d)
    return ir.Shape(dims)
