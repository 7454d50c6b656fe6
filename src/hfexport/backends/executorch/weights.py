"""A tied weight stored once: the program's weights in one ``.ptd`` data file beside the ``.pte``.

A model whose input embedding and ``lm_head`` share one tensor (SmolLM2, most small LMs) had it twice in the
``.pte``: once as a program constant for the embedding lookup (a gather, which XNNPACK does not take) and once in
XNNPACK's named data for the ``lm_head`` matmul (1.21x the weights on SmolLM2-135M). ExecuTorch's named-data store
keeps one buffer per content (SHA-256), but only within one store: program constants go to the ``.pte``'s constant
segment, delegate data to its named data. Tagging both for the same external file puts them in one store, where
the two copies are one buffer: every program constant via ``ExecutorchBackendConfig(external_constants=...)``,
every XNNPACK weight via the placeholders' ``meta["custom"]["delegate_constant_tag"]`` (read by XNNPACK's
``node_visitor``). The ``.pte`` then holds the graph, the ``.ptd`` the weights, and the runtime loads both
(``Runtime.load_program(pte, data_path=ptd)``). Models without tied weights keep the single ``.pte``, unless a
second program of the export shares its weights (:mod:`.shared`: then one ``.ptd`` serves both).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.export.graph_signature import InputKind

__all__ = ["DATA_TAG", "has_tied_weights", "own_data_path", "tag_weights_external", "write_data"]

DATA_TAG = "weights"
_WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def has_tied_weights(model: Any) -> bool:
    """Whether two of ``model``'s parameter names point at one tensor (``named_parameters`` lists it once)."""
    if not isinstance(model, torch.nn.Module):
        return False
    every = list(model.named_parameters(remove_duplicate=False))
    return len(every) != len(list(model.named_parameters()))


def tag_weights_external(program: torch.export.ExportedProgram, tag: str = DATA_TAG) -> int:
    """Tag the weight placeholders of ``program`` (parameters, persistent buffers, tensor constants; not the mutable
    buffers) for the external file ``tag``, in place; return how many."""
    signature = program.graph_signature
    mutated = set(signature.buffers_to_mutate.values())
    names = {s.arg.name for s in signature.input_specs
             if s.kind in _WEIGHT_KINDS and getattr(s, "target", None) not in mutated}
    count = 0
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            node.meta.setdefault("custom", {})["delegate_constant_tag"] = tag
            count += 1
    return count


def own_data_path(pte: str | Path) -> Path:
    """Where the ``.ptd`` written for the ``.pte`` at ``pte`` alone lives: beside it, same stem (the programs of one
    export may then share one, see :mod:`.shared`)."""
    return Path(pte).with_suffix(".ptd")


def write_data(manager: Any, pte: str | Path) -> Path | None:
    """Write ``manager``'s external data (if any) beside the ``.pte`` at ``pte``; return its path."""
    files = _data(manager)
    if not files:
        return None
    if len(files) != 1:  # ours: DATA_TAG (weights); the CUDA backend's: "aoti_cuda_blob" (kernels and weights)
        raise RuntimeError(f"expected one external data file, the program has {sorted(files)}")
    target = own_data_path(pte)
    with open(target, "wb") as file:
        next(iter(files.values())).write_to_file(file)  # a Cord: written piece by piece, never joined in memory
    return target


def _data(manager: Any) -> dict[str, Any]:
    """``{tag: Cord}`` of the manager's external data (``ExecutorchProgramManager`` serialises it when built and
    keeps it private in executorch 1.5.1; its public writer, ``write_tensor_data_to_file``, names files by tag)."""
    return dict(getattr(manager, "_tensor_data", None) or {})


def temporary_data(manager: Any) -> str | None:
    """The path of a temporary copy of ``manager``'s external data, for loading the unsaved program (kept on the
    manager, removed with it)."""
    if not _data(manager):
        return None
    held = getattr(manager, "_hfexport_data_dir", None)
    if held is None:
        held = tempfile.TemporaryDirectory(prefix="hfexport-ptd-")
        manager._hfexport_data_dir = held
        write_data(manager, Path(held.name) / "program.pte")
    return str(Path(held.name) / "program.ptd")
