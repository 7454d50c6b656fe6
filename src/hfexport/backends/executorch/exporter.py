"""``ExecutorchExporter``: ``torch.export`` -> ``to_edge_transform_and_lower`` (XNNPACK / CUDA / MLX partitioner)
-> ``to_executorch`` with the config's memory planning -> ``.pte``."""

from __future__ import annotations

import dataclasses
import logging
import shutil
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch

from ...configs import ExecutorchConfig, ExportFormat
from ...exporter import HfExporter
from ...stages import ExportStep
from ...metadata import ExportMetadata, LeafRole
from .custom_sdpa import (
    CUSTOM_OPS_STATE, CustomOpsUnsupported, custom_ops_unsupported, llama_custom_ops, record_state_layout,
)
from .layout import record_program_outputs
from .lowering import lower
from .state import FoldedState, fold_cache_state, keeps_cache_state
from .targets import target_for
from .shared import data_path, share_data, shares_weights
from .weights import has_tied_weights, own_data_path, write_data

__all__ = ["ExecutorchExporter"]

logger = logging.getLogger(__name__)

_PACKAGES = ("executorch", "torchao")


class ExecutorchExporter(HfExporter):
    """Exporter that converts a ``PreTrainedModel`` to an ExecuTorch ``ExecutorchProgramManager``, run on the
    ExecuTorch runtime.

    Example:
        >>> from hfexport.exporter_executorch import ExecutorchExporter, ExecutorchConfig
        >>> exported = ExecutorchExporter().export(model, inputs, config=ExecutorchConfig(backend="xnnpack"))
        >>> outputs = exported(**inputs)  # on the ExecuTorch runtime
        >>> exported.save_pretrained("exported")  # model.pte, its metadata and the model config
    """

    export_format = ExportFormat.EXECUTORCH
    config_class = ExecutorchConfig
    required_packages = {"executorch": "1.0", "torchao": "0.10"}
    package_extra = "executorch"

    trace_packages = ("executorch", "torchao")

    def export_program(
        self, model: torch.nn.Module, sample_inputs: MutableMapping[str, Any], config: ExecutorchConfig
    ) -> tuple[Any, ExportMetadata]:
        """The template's stages, first with the llama custom ops (a static cache kept as state, its attention by
        ``llama::custom_sdpa``), and without them when an attention call cannot be expressed by those kernels."""
        target = target_for(config.backend)
        target.check(model, sample_inputs)  # this machine can lower for it, and the inputs suit it
        # a cache kept as state is a buffer of fixed size: its dims stay static (and a static cache's always do)
        stateful = keeps_cache_state(config, sample_inputs)
        plan = _Plan(target, stateful, external=config.backend == "xnnpack" and has_tied_weights(model))
        reason = custom_ops_unsupported(model, sample_inputs, config) if stateful else "the cache is not kept as state"
        if reason is None:
            try:
                with llama_custom_ops(sample_inputs) as traced:
                    custom = dataclasses.replace(plan, state_leaves=CUSTOM_OPS_STATE)
                    return self.export_stages(model, _contiguous(traced), config, plan=custom, static_caches=stateful)
            except Exception as e:  # noqa: BLE001 - only an attention the kernels cannot express falls back
                unsupported = _cause(e, CustomOpsUnsupported)
                if unsupported is None:
                    raise
                reason = str(unsupported)
        logger.info("ExecuTorch: SDPA attention over the whole cache (no llama custom ops: %s)", reason)
        return self.export_stages(model, _contiguous(sample_inputs), config, plan=plan, static_caches=stateful)

    def lower(self, program: torch.export.ExportedProgram, metadata: ExportMetadata, step: ExportStep) -> Any:
        """Fold a static cache into state (when kept as state), then ``to_edge_transform_and_lower`` and
        ``to_executorch`` (inside the workaround scope: the ExecuTorch workarounds, e.g. MoE experts, still hold)."""
        plan: _Plan = step.plan
        folded = None
        if plan.stateful:
            program, folded = fold_cache_state(program, metadata, *plan.leaves())
        # a tied weight, or weights that a second program of the export shares: to a .ptd (then one shared file)
        external = plan.external or (step.config.backend == "xnnpack" and shares_weights(step.component, metadata))
        manager = lower(program, step.config, plan.target, step.model, step.parts, external=external)
        return _Lowered(manager, folded)

    def finish(self, lowered: Any, metadata: ExportMetadata, step: ExportStep) -> Any:
        """The program's outputs (and, on the custom-op path, the cache layout it keeps) written into the metadata."""
        if step.plan.state_leaves is not None:
            record_state_layout(metadata)
        record_program_outputs(lowered.manager, metadata, state=lowered.folded)
        return lowered.manager

    # --- files --------------------------------------------------------------------------------------------------

    def program_suffix(self) -> str:
        return ".pte"

    def save_program(self, program: Any, path: str | Path) -> None:
        """Stream the ``.pte`` to ``path``; a program read back by :meth:`load_program` copies its file."""
        source = getattr(program, "hfexport_path", None)
        if source is not None:
            if Path(source).resolve() != Path(path).resolve():
                shutil.copyfile(source, path)
                if data_path(source).exists():  # its own .ptd or the shared one: saved as its own, merged again
                    shutil.copyfile(data_path(source), own_data_path(path))
            return
        with open(path, "wb") as file:
            program.write_to_file(file)
        write_data(program, path)

    def save_programs(self, programs: Mapping[str, Any], directory: Path) -> dict[str, list[str]]:
        """As the default, plus each program's ``.ptd`` (its weights, when stored outside the ``.pte``); the ``.ptd``
        files of several programs merged into one, each weight stored once (see :mod:`.shared`)."""
        files = super().save_programs(programs, directory)
        for names in files.values():
            ptd = own_data_path(names[0]).name
            if (Path(directory) / ptd).exists() and ptd not in names:
                names.append(ptd)
        return share_data(Path(directory), files)

    def load_program(self, path: str | Path) -> Any:
        """The ``.pte`` as an ``executorch.runtime.Program`` (the spec's contract: the export-time
        ``ExecutorchProgramManager`` cannot be rebuilt from the file). It keeps its path, to be saved again.

        Raises:
            ManifestError: the program or its ``.ptd`` is corrupt, unlisted, or holds what hfexport never writes
                (see :func:`.safety.check_program`).
        """
        from executorch.runtime import Runtime, Verification

        from .memory import check_file_memory
        from .safety import check_program

        # before the runtime reads a byte: headers and segments in bounds, only our delegates and registered
        # operators, XNNPACK constants naming valid keys, and a .ptd only where the export lists it
        data = check_program(Path(path))
        check_file_memory(Path(path))  # (load_program allocates the methods' memory plans)
        program = Runtime.get().load_program(
            Path(path), verification=Verification.InternalConsistency, data_path=data
        )
        program.hfexport_path = str(path)
        return program


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What an export decided before tracing: the lowering target, whether the static cache is kept as state (and
    which of its leaves) and whether the weights go to a ``.ptd``."""

    target: Any
    stateful: bool
    external: bool
    state_leaves: tuple[LeafRole, ...] | None = None  # None: fold_cache_state's default leaves

    def leaves(self) -> tuple[tuple[LeafRole, ...], ...]:
        return () if self.state_leaves is None else (self.state_leaves,)


@dataclasses.dataclass(frozen=True)
class _Lowered:
    manager: Any
    folded: FoldedState | None


def _cause(error: BaseException, kind: type) -> BaseException | None:
    """``error`` or the first exception of ``kind`` in its cause/context chain (torch.export wraps what the model
    raised)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def _contiguous(inputs: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """ExecuTorch rejects stride-0 (broadcast) inputs; a contiguous tensor is passed through as itself, so a cache
    keeps its identity."""
    out = type(inputs)() if isinstance(inputs, dict) else dict()
    for key, value in inputs.items():
        out[key] = value.contiguous() if isinstance(value, torch.Tensor) else value
    return out
