"""Weights stored once across an export's programs: one ``model.ptd`` that every ``.pte`` of the export loads.

A generation export with a dynamic cache (or a single-token decode) has two programs, ``prefill.pte`` and
``decode.pte``, over the same weights. Each program's weights go to external data (``external_constants`` for the
program's constants, ``delegate_constant_tag`` for XNNPACK's, see :mod:`.weights`), one ``.ptd`` per program as
ExecuTorch writes them; the save then merges those files into one with ExecuTorch's own ``FlatTensorSerializer``:
every key once, every distinct buffer once (XNNPACK's keys are the SHA-256 of the bytes, so the two programs' copies
of a weight are one key). ExecuTorch keeps one named-data store per program and has no writer for a store shared
by programs saved apart (executorch 1.5.1, ``exir/program/_program.py``: ``_tensor_data`` per manager); a
multi-method program would share it, but each component here is a program of its own, run by its own runner.

The runtime side needs nothing new: ``Runtime.load_program(pte, data_path=...)`` takes any data file whose keys
cover the program's, so each program is loaded with the shared file (:func:`data_path`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .weights import own_data_path

__all__ = ["SHARED_DATA", "data_path", "merge_data", "share_data", "shares_weights"]

logger = logging.getLogger(__name__)

SHARED_DATA = "model.ptd"
"""The data file shared by an export's programs (a single ``model.pte`` has it as its own ``.ptd`` too)."""


def data_path(pte: str | Path) -> Path:
    """The data file the ``.pte`` at ``pte`` loads: its own ``.ptd`` when there is one, else the export's shared
    :data:`SHARED_DATA` (which may not exist: the program then keeps its weights inside)."""
    own = own_data_path(pte)
    shared = Path(pte).parent / SHARED_DATA
    return own if os.path.lexists(own) or not os.path.lexists(shared) else shared


def shares_weights(component: str, metadata: Any) -> bool:
    """Whether the generation component ``component`` is one of two programs over the same weights: a prefill graph
    of its own, or a decode graph that will not serve the prefill (a dynamic cache, or a single-token query axis).
    A multi-token decode over a static cache serves the prompt too (``HfExporter.serves_prefill``): one program."""
    if component == "prefill":
        return True
    if component != "decode" or metadata.cache_kwarg is None:
        return False  # an encoder, a plain forward, or a cacheless decode that reruns the sequence (one program)
    multi_token = isinstance(metadata.query_axis(), str)
    return not (multi_token and metadata.cache_type == "StaticCache")


def merge_data(blobs: list[bytes]) -> Any | None:
    """One ``.ptd`` (a ``Cord``) holding the named data of every ``.ptd`` in ``blobs``: each key once, each distinct
    buffer once. ``None`` when two files give one key different bytes or layouts (the programs could not share)."""
    from executorch.exir._serialize._cord import Cord
    from executorch.exir._serialize.data_serializer import DataEntry, DataPayload
    from executorch.extension.flat_tensor.serialize.serialize import FlatTensorSerializer

    serializer = FlatTensorSerializer()
    buffers: list[bytes] = []
    digests: dict[bytes, int] = {}
    entries: dict[str, Any] = {}
    for blob in blobs:
        payload = serializer.deserialize(Cord(blob))
        for key, entry in payload.named_data.items():
            data = bytes(payload.buffers[entry.buffer_index])
            digest = hashlib.sha256(data).digest()
            if key in entries:
                known = entries[key]
                if digests.get(digest) != known.buffer_index or known.tensor_layout != entry.tensor_layout:
                    return None
                continue
            index = digests.setdefault(digest, len(buffers))
            if index == len(buffers):
                buffers.append(data)
            # the serializer aligns every segment to its segment_alignment (128 bytes): XNNPACK's 16 and more
            entries[key] = DataEntry(buffer_index=index, alignment=1, tensor_layout=entry.tensor_layout)
    return serializer.serialize(DataPayload(buffers=buffers, named_data=entries))


def share_data(directory: Path, files: Mapping[str, list[str]]) -> dict[str, list[str]]:
    """Merge the ``.ptd`` files the components in ``files`` list into :data:`SHARED_DATA` in ``directory`` and
    return ``files`` naming it instead; unchanged when fewer than two programs have one, or when they cannot share
    (a key with two contents: logged)."""
    directory = Path(directory)
    own = sorted({n for names in files.values() for n in names if n.endswith(".ptd") and n != SHARED_DATA})
    if len(own) < 2:
        return dict(files)
    merged = merge_data([(directory / name).read_bytes() for name in own])
    if merged is None:
        logger.warning("ExecuTorch: %s give one key different data; each program keeps its own .ptd", own)
        return dict(files)
    partial = directory / (SHARED_DATA + ".partial")
    with open(partial, "wb") as file:
        merged.write_to_file(file)
    os.replace(partial, directory / SHARED_DATA)
    for name in own:
        (directory / name).unlink()
    return {component: list(dict.fromkeys(SHARED_DATA if n in own else n for n in names))
            for component, names in files.items()}
