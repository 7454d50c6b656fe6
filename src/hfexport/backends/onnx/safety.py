"""Checks on a saved ``.onnx`` graph before ONNX Runtime (or onnx_ir) opens any file it names.

What an ONNX file makes its runtime read or run (onnxruntime 1.32, onnx_ir 0.x):

- **External data.** Any ``TensorProto`` (initializers, sparse initializers, tensors in node attributes, in
  subgraphs of ``If``/``Loop``/``Scan``, in model-local functions) may keep its bytes in another file, named by
  the ``location`` entry of ``external_data`` with an ``offset`` and ``length``. ONNX Runtime refuses absolute and
  escaping locations itself, but reads any other file in the folder, listed in ``export.json`` or not; its
  special location ``*/_ORT_MEM_ADDR_/*`` names a memory address instead of a file.
- **Operators.** A node runs the kernel registered for its ``(domain, op_type)``. ONNX Runtime ships the ONNX
  domains and ``com.microsoft`` (plus internal ones its optimizer writes); any other domain needs a custom-op
  library the *caller* registers (``SessionOptions.register_custom_ops_library``): without one the session fails
  with "is not a registered function/op". ``com.microsoft:EPContext`` hands an execution provider (TensorRT, QNN,
  OpenVINO EP) a precompiled engine, embedded or as a file path (``ep_cache_context``).
- **Session options from the model.** With ``ORT_LOAD_CONFIG_FROM_MODEL=1`` in the environment, ONNX Runtime reads
  session options from the ``ort_config`` metadata entry, ``enable_profiling`` among them (a JSON file written into
  the working directory).

hfexport writes none of the risky forms: its external data is one listed file beside the graph, its operators are
ONNX and ``com.microsoft`` contrib ops. :func:`read_checked` parses the graph (never the weights) and refuses
everything else, naming the tensor or node.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx

from ...errors import ManifestError
from ...manifest import listed_files, reference_problem
from ...manifest_schema import fail

__all__ = ["ALLOWED_DOMAINS", "REFUSED_OPS", "read_checked", "check_model_proto"]

ALLOWED_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "com.microsoft"})
"""Operator domains a saved graph may use: the ONNX standard ones, and ONNX Runtime's contrib ops (what
``OnnxConfig(ort_fusions=...)`` and the quantizers write). ONNX Runtime's internal domains (``com.microsoft.nchwc``,
``com.ms.internal.nhwc``, ...) only appear in graphs its optimizer saved, which hfexport never does."""

REFUSED_OPS = frozenset({("com.microsoft", "EPContext"), ("com.microsoft", "PythonOp"),
                         ("com.microsoft", "PythonOpGrad")})
"""Ops in an allowed domain that load something besides the graph: an execution provider's precompiled engine
(``EPContext``), a Python autograd function (``PythonOp``, training builds)."""

_MEMORY_TAG = "*/_ORT_MEM_ADDR_/*"
_ADVICE = "re-export the model, or get the export from a trusted source"
# bits per element of each TensorProto data type (STRING cannot be external, and has no fixed size)
_BITS = {1: 32, 2: 8, 3: 8, 4: 16, 5: 16, 6: 32, 7: 64, 9: 8, 10: 16, 11: 64, 12: 32, 13: 64, 14: 64, 15: 128,
         16: 16, 17: 8, 18: 8, 19: 8, 20: 8, 21: 4, 22: 4, 23: 4, 24: 8, 25: 2, 26: 2}


def read_checked(path: Path) -> onnx.ModelProto:
    """Parse the graph at ``path`` (its external data untouched) and run :func:`check_model_proto` on it.

    Raises:
        ManifestError: the file is not an ONNX protobuf, or any check fails.
    """
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as e:  # noqa: BLE001 - protobuf's DecodeError and friends: the file is corrupt
        raise ManifestError(str(path), [
            f"{path.name}: not a valid ONNX protobuf ({type(e).__name__}: {str(e)[:200]}); {_ADVICE}"
        ]) from None
    check_model_proto(proto, path)
    return proto


def check_model_proto(proto: onnx.ModelProto, path: Path) -> None:
    """Refuse a graph that reads a file outside its export, uses an operator this runtime should not run, or
    carries session options.

    Args:
        proto: The parsed graph (``onnx.load(..., load_external_data=False)``).
        path: Where it was read from; the folder it is in is the export it belongs to.

    Raises:
        ManifestError: listing every problem, each naming the file and the tensor or node.
    """
    folder = path.parent
    problems: list[str] = []
    listed = listed_files(folder)
    sizes: dict[str, int | None] = {}  # location -> file size, or None where refused (each location checked once)
    for label, tensor in _model_tensors(proto):
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            problem = _external_problem(folder, tensor, listed, sizes)
            if problem:
                problems.append(f"{path.name}: {label} {problem}; {_ADVICE}")
    functions = {(f.domain, f.name) for f in proto.functions}
    for label, node in _model_nodes(proto):
        problem = _operator_problem(node, functions)
        if problem:
            problems.append(f"{path.name}: {label} {problem}; {_ADVICE}")
    for entry in proto.metadata_props:
        if entry.key == "ort_config":
            problems.append(f"{path.name}: metadata 'ort_config' carries ONNX Runtime session options (read when "
                            f"ORT_LOAD_CONFIG_FROM_MODEL=1; they can turn on profiling, which writes files); {_ADVICE}")
    if problems:
        fail(str(path), problems)  # ManifestError, the list capped



def _external_problem(folder: Path, tensor: onnx.TensorProto, listed: set[str], sizes: dict) -> str | None:
    info = {entry.key: entry.value for entry in tensor.external_data}
    location = info.get("location", "")
    if not location:
        return "is marked as external data but names no file ('location')"
    if location == _MEMORY_TAG:
        return f"reads its data from a memory address ({_MEMORY_TAG!r}) instead of a file"
    if location not in sizes:
        problem = reference_problem(folder, location, listed)
        sizes[location] = None if problem else os.stat(folder / location).st_size
        if problem:
            return f"reads external data from {location!r}: {problem}"
    size = sizes[location]
    if size is None:
        return None  # refused at its first tensor: one line per file is enough
    try:
        offset = int(info.get("offset", "0"))
        length = int(info["length"]) if "length" in info else None
    except ValueError:
        return f"has a non-integer external data offset or length ({info.get('offset')!r}, {info.get('length')!r})"
    expected = _nbytes(tensor)
    if offset < 0 or (length is not None and length < 0):
        return f"has a negative external data offset or length ({offset}, {length})"
    if length is not None and expected is not None and length != expected:
        return f"has external data length {length}, but its shape and type need {expected} bytes"
    span = length if length is not None else expected
    if span is not None and offset + span > size:
        return f"reads bytes {offset}..{offset + span} of {location!r}, which has {size}"
    return None


def _nbytes(tensor: onnx.TensorProto) -> int | None:
    bits = _BITS.get(tensor.data_type)
    return None if bits is None else math.ceil(math.prod(tensor.dims) * bits / 8)


def _operator_problem(node: onnx.NodeProto, functions: set[tuple[str, str]]) -> str | None:
    if (node.domain, node.op_type) in REFUSED_OPS:
        return "loads code or a precompiled engine from outside the graph"
    if node.domain in ALLOWED_DOMAINS or (node.domain, node.op_type) in functions:
        return None
    # ORT runs such a node only with a custom-op library the caller registered; hfexport never writes one
    return (f"uses the operator domain {node.domain!r}, which neither ONNX nor ONNX Runtime defines (it would need "
            "a custom-op library)")


def _model_tensors(proto: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    yield from _graph_tensors(proto.graph)
    for function in proto.functions:
        for node in function.node:
            yield from _node_tensors(node)
    for info in proto.training_info:  # never run by inference, but a reader may still load its tensors
        yield from _graph_tensors(info.initialization)
        yield from _graph_tensors(info.algorithm)


def _graph_tensors(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    for tensor in graph.initializer:
        yield f"initializer {tensor.name!r}", tensor
    for sparse in graph.sparse_initializer:
        yield f"sparse initializer {sparse.values.name!r} (values)", sparse.values
        yield f"sparse initializer {sparse.values.name!r} (indices)", sparse.indices
    for node in graph.node:
        yield from _node_tensors(node)


def _node_tensors(node: onnx.NodeProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    for attribute in node.attribute:
        label = f"node {node.name or node.op_type!r} attribute {attribute.name!r}"
        if attribute.HasField("t"):
            yield label, attribute.t
        for tensor in attribute.tensors:
            yield label, tensor
        for sparse in ([attribute.sparse_tensor] if attribute.HasField("sparse_tensor") else []) + list(
            attribute.sparse_tensors
        ):
            yield f"{label} (sparse values)", sparse.values
            yield f"{label} (sparse indices)", sparse.indices
        for graph in _subgraphs(attribute):
            yield from _graph_tensors(graph)


def _model_nodes(proto: onnx.ModelProto) -> Iterator[tuple[str, onnx.NodeProto]]:
    yield from _graph_nodes(proto.graph)
    for function in proto.functions:
        for node in function.node:
            yield from _node_and_subgraphs(node, f" in function {function.domain}:{function.name}")


def _graph_nodes(graph: onnx.GraphProto) -> Iterator[tuple[str, onnx.NodeProto]]:
    for node in graph.node:
        yield from _node_and_subgraphs(node, "")


def _node_and_subgraphs(node: onnx.NodeProto, where: str) -> Iterator[tuple[str, onnx.NodeProto]]:
    yield f"node {node.name!r} ({node.domain or 'ai.onnx'}:{node.op_type}){where}", node
    for attribute in node.attribute:
        for graph in _subgraphs(attribute):
            yield from _graph_nodes(graph)


def _subgraphs(attribute: onnx.AttributeProto) -> list[Any]:
    return ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs)
