"""Weights that several ``.pt2`` programs of one export share, stored once.

A dynamic-cache ``export_for_generation`` traces a prefill and a decode program from the same model, and each
``torch.export.save`` archive would hold every weight (a 2x folder). Here the tensors two or more programs hold (the
same tensor object: they come from one model) go once into ``shared_weights.safetensors``; each archive keeps, in
their place, a zero-stride placeholder of the same shape and dtype (a few bytes) and, as an extra file, which of its
state-dict entries come from which shared key. Loading swaps the placeholders back for the shared tensors, one copy
in memory for every program of the folder.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ...errors import ManifestError
from ...manifest import listed_files, reference_problem

__all__ = ["SHARED_WEIGHTS_NAME", "EXTRA_FILE", "split_shared", "attach_shared"]

SHARED_WEIGHTS_NAME = "shared_weights.safetensors"
EXTRA_FILE = "hfexport_shared_weights.json"  # inside each .pt2: {"file": ..., "tensors": {fqn: key}}


def _identity(tensor: torch.Tensor) -> tuple:
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride(),
            tensor.dtype, tensor.device.type)


def _placeholder(tensor: torch.Tensor) -> torch.Tensor:
    stub = torch.zeros((), dtype=tensor.dtype).expand(tensor.shape)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(stub, requires_grad=tensor.requires_grad)
    return stub


def split_shared(
    programs: Sequence[torch.export.ExportedProgram],
) -> tuple[list[torch.export.ExportedProgram], list[dict[str, str]], dict[str, torch.Tensor]]:
    """Programs to save (shared weights replaced by placeholders; the originals are not touched), each one's
    ``{fqn: shared key}``, and the shared tensors by key. A tensor counts as shared when two programs hold it."""
    holders: dict[tuple, set[int]] = {}
    for index, program in enumerate(programs):
        for tensor in program.state_dict.values():
            holders.setdefault(_identity(tensor), set()).add(index)
    keys: dict[tuple, str] = {}
    shared: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    stripped, mappings = [], []
    for index, program in enumerate(programs):
        state, mapping = dict(program.state_dict), {}
        for fqn, tensor in program.state_dict.items():
            ident = _identity(tensor)
            if len(holders[ident]) < 2:
                continue
            if ident not in keys:
                keys[ident] = key = f"w{len(keys)}"
                data = tensor.detach()
                # safetensors stores contiguous tensors that share no memory with another key
                if not data.is_contiguous() or ident[0] in storages:
                    data = data.contiguous().clone()
                storages.add(ident[0])
                shared[key] = data
            mapping[fqn] = keys[ident]
            state[fqn] = _placeholder(tensor)
        copied = copy.copy(program)
        copied._state_dict = state
        stripped.append(copied)
        mappings.append(mapping)
    return stripped, mappings, shared


def extra_file(mapping: dict[str, str]) -> dict[str, str]:
    """The extra file a stripped program's archive carries."""
    return {EXTRA_FILE: json.dumps({"file": SHARED_WEIGHTS_NAME, "tensors": mapping})}


def attach_shared(program: torch.export.ExportedProgram, path: Path, record: str, cache: dict[Path, Any]) -> None:
    """Swap ``program``'s placeholders for the shared tensors named in ``record`` (the archive's extra file).

    ``cache`` maps a shared file to its loaded tensors, so the programs of one folder share one copy. A record that
    names another file than :data:`SHARED_WEIGHTS_NAME`, a missing key, or a tensor of another shape or dtype than
    the placeholder is a :class:`ManifestError` (a tampered or mixed-up folder).
    """
    try:
        info = json.loads(record)
        name, tensors = info["file"], dict(info["tensors"])
    except (ValueError, KeyError, TypeError) as e:
        raise ManifestError(str(path), [f"unreadable {EXTRA_FILE} ({e})"]) from None
    if name != SHARED_WEIGHTS_NAME:
        raise ManifestError(str(path), [f"{EXTRA_FILE} names {name!r}; only {SHARED_WEIGHTS_NAME!r} is allowed"])
    location = Path(path).parent / SHARED_WEIGHTS_NAME
    if location not in cache:
        if not os.path.lexists(location):
            raise ManifestError(str(path), [f"{SHARED_WEIGHTS_NAME} is missing beside it (it holds shared weights)"])
        # the same file rule as every program's other files: listed in the manifest, inside the folder
        bad = reference_problem(location.parent, SHARED_WEIGHTS_NAME, listed_files(location.parent))
        if bad:
            raise ManifestError(str(path), [f"its shared weights: {bad}"])
        from safetensors.torch import load_file

        cache[location] = {"tensors": load_file(str(location)), "parameters": {}}
    loaded = cache[location]
    problems = []
    state = program.state_dict
    for fqn, key in tensors.items():
        stub, value = state.get(fqn), loaded["tensors"].get(key)
        if stub is None or value is None:
            problems.append(f"{fqn}: {'no such state-dict entry' if stub is None else f'no tensor {key!r}'}")
            continue
        if tuple(value.shape) != tuple(stub.shape) or value.dtype != stub.dtype:
            problems.append(f"{fqn}: {key!r} is {tuple(value.shape)} {value.dtype}, the program expects "
                            f"{tuple(stub.shape)} {stub.dtype}")
            continue
        if isinstance(stub, torch.nn.Parameter):
            value = loaded["parameters"].setdefault(key, torch.nn.Parameter(value, requires_grad=stub.requires_grad))
        state[fqn] = value
    if problems:
        raise ManifestError(str(location), problems)
