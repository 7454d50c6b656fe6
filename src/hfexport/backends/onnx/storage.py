"""Saving and loading ONNX programs: the graph in ``<name>.onnx``, every weight in external data.

Weights never go into the protobuf (it stays small and fast to parse, and models past protobuf's 2 GB limit save
too). Components of one export share a single data file in which each distinct tensor is stored once, so a
generative export whose prefill and decode graphs hold the same weights costs the weights once on disk.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

import onnx_ir as ir

from . import safety
from .session import PATH_KEY

__all__ = ["INLINE_LIMIT", "SHARED_DATA_NAME", "data_name_for", "save_models", "load_model"]

INLINE_LIMIT = 256
"""Initializers up to this many bytes (scalars, small shapes) stay in the graph; the rest go to external data."""
SHARED_DATA_NAME = "weights.onnx.data"
_ALIGN = 4096


def data_name_for(filename: str) -> str:
    """The external-data file of a program saved alone as ``filename``: ``model.onnx`` -> ``model.onnx.data``."""
    return f"{filename}.data"


def _initializer_values(model: ir.Model) -> list[ir.Value]:
    return [value for graph in model.graphs() for value in graph.initializers.values()]


def save_models(models: Mapping[str, ir.Model], directory: str | Path, data_name: str) -> None:
    """Write ``{filename: model}`` into ``directory`` with all their weights in one data file, each distinct
    tensor (same dtype, shape and bytes) stored once. The models are left unchanged."""
    directory = Path(directory)
    index: dict[tuple, tuple[int, int]] = {}
    offset = 0
    with open(directory / data_name, "wb") as data:
        for filename, model in models.items():
            swapped: list[tuple[ir.Value, object]] = []
            try:
                for value in _initializer_values(model):
                    tensor = value.const_value
                    if tensor is None or tensor.nbytes <= INLINE_LIMIT:
                        continue
                    raw = tensor.tobytes()
                    key = (tensor.dtype, tuple(tensor.shape), len(raw), hashlib.blake2b(raw, digest_size=20).digest())
                    if key not in index:
                        padding = (-offset) % _ALIGN
                        data.write(b"\0" * padding)
                        offset += padding
                        data.write(raw)
                        index[key] = (offset, len(raw))
                        offset += len(raw)
                    start, length = index[key]
                    external = ir.ExternalTensor(
                        data_name, start, length, tensor.dtype, shape=tensor.shape, name=tensor.name,
                        base_dir=str(directory),
                    )
                    swapped.append((value, tensor))
                    value.const_value = external
                ir.save(model, directory / filename)
            finally:
                for value, tensor in swapped:
                    value.const_value = tensor
        data.flush()
        os.fsync(data.fileno())


def load_model(path: str | Path) -> ir.Model:
    """Read a saved program; its weights stay in the data file (memory-mapped on first use).

    The graph is checked first (:func:`.safety.read_checked`: every file it names is a listed file of the export,
    every operator one ONNX Runtime ships), before onnx_ir or ONNX Runtime opens anything it names. The file it came
    from is kept in ``model.meta[PATH_KEY]`` so that ONNX Runtime reads it directly.

    Raises:
        ManifestError: the graph is corrupt or names something outside its export.
    """
    path = Path(os.path.abspath(path))
    # what ir.load does, from the protobuf the checks parsed: the graph is parsed once
    model = ir.serde.deserialize_model(safety.read_checked(path))
    ir.external_data.set_base_dir(model.graph, str(path.parent))
    model.meta[PATH_KEY] = str(path)
    _follow_data_links(model)
    return model


def _follow_data_links(model: ir.Model) -> None:
    """A Hub cache snapshot stores files as links into its ``blobs/`` folder, which onnx_ir's containment check
    refuses: point those tensors at the link's target (the manifest has already checked where links lead)."""
    for value in _initializer_values(model):
        tensor = value.const_value
        if not isinstance(tensor, ir.ExternalTensor) or not os.path.islink(tensor.path):
            continue
        target = os.path.realpath(tensor.path)
        value.const_value = ir.ExternalTensor(
            os.path.basename(target), tensor.offset, tensor.length, tensor.dtype, shape=tensor.shape,
            name=tensor.name, base_dir=os.path.dirname(target),
        )
