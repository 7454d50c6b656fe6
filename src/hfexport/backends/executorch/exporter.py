"""``ExecutorchExporter``: ``torch.export`` -> ``to_edge_transform_and_lower`` (XNNPACK / CUDA / MLX partitioner)
-> ``to_executorch`` with the config's memory planning -> ``.pte``."""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch

from ...configs import ExecutorchConfig, ExportFormat
from ...exporter import HfExporter
from ...metadata import ExportMetadata
from .custom_sdpa import (
    CUSTOM_OPS_STATE, CustomOpsUnsupported, custom_ops_unsupported, llama_custom_ops, record_state_layout,
)
from .layout import record_program_outputs
from .lowering import lower
from .state import FoldedState, fold_cache_state, keeps_cache_state
from .targets import target_for
from .weights import data_path, has_tied_weights, write_data

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

    def __init__(self) -> None:
        #: seconds per phase (trace, to_edge_and_lower, to_executorch) of each program this exporter lowered
        self.phase_timings: list[dict[str, float]] = []

    def export_program(
        self, model: torch.nn.Module, sample_inputs: MutableMapping[str, Any], config: ExecutorchConfig
    ) -> tuple[Any, ExportMetadata]:
        target = target_for(config.backend)
        target.check(model, sample_inputs)
        # a cache kept as state is a buffer of fixed size: its dims stay static (and a static cache's always do)
        stateful = keeps_cache_state(config, sample_inputs)
        external = config.backend == "xnnpack" and has_tied_weights(model)  # a tied weight stored once, in a .ptd
        quantizer = config.quantizer
        if quantizer is not None:
            quantizer.validate_environment(self.export_format)
        lowered: list[Any] = []
        folded: list[FoldedState | None] = []
        timings: dict[str, float] = {}
        start = time.perf_counter()

        def convert(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
            # inside the trace's workaround scope: the ExecuTorch workarounds (e.g. MoE experts) still hold
            if quantizer is not None:
                program = quantizer.quantize(program, sample_inputs, self.export_format)
            timings["trace"] = time.perf_counter() - start
            kept, state = fold_cache_state(program, sample_inputs, *leaves) if stateful else (program, None)
            folded.append(state)
            lowered.append(lower(kept, config, target, model, timings, external=external))
            return program

        reason = custom_ops_unsupported(model, sample_inputs, config) if stateful else "the cache is not kept as state"
        metadata = None
        leaves: list[tuple[str, ...]] = []
        if reason is None:
            try:
                leaves.append(CUSTOM_OPS_STATE)
                with llama_custom_ops(sample_inputs) as traced:
                    _, metadata = self.trace(model, _contiguous(traced), config, packages=_PACKAGES, transform=convert,
                                             static_caches=stateful)
                record_state_layout(metadata)
            except Exception as e:  # noqa: BLE001 - only an attention the kernels cannot express falls back
                unsupported = _cause(e, CustomOpsUnsupported)
                if unsupported is None:
                    raise
                reason, metadata = str(unsupported), None
                lowered.clear()
                folded.clear()
                leaves.clear()
                start = time.perf_counter()
        if metadata is None:
            logger.info("ExecuTorch: SDPA attention over the whole cache (no llama custom ops: %s)", reason)
            _, metadata = self.trace(model, _contiguous(sample_inputs), config, packages=_PACKAGES, transform=convert,
                                     static_caches=stateful)
        record_program_outputs(lowered[0], metadata, state=folded[0])
        self.phase_timings.append(timings)
        return lowered[0], metadata

    # --- files --------------------------------------------------------------------------------------------------

    def program_suffix(self) -> str:
        return ".pte"

    def save_program(self, program: Any, path: str | Path) -> None:
        """Stream the ``.pte`` to ``path``; a program read back by :meth:`load_program` copies its file."""
        source = getattr(program, "hfexport_path", None)
        if source is not None:
            if Path(source).resolve() != Path(path).resolve():
                shutil.copyfile(source, path)
                if data_path(source).exists():
                    shutil.copyfile(data_path(source), data_path(path))
            return
        with open(path, "wb") as file:
            program.write_to_file(file)
        write_data(program, path)

    def save_programs(self, programs: Mapping[str, Any], directory: Path) -> dict[str, list[str]]:
        """As the default, plus each program's ``.ptd`` (its weights, when stored outside the ``.pte``)."""
        files = super().save_programs(programs, directory)
        for names in files.values():
            ptd = data_path(names[0]).name
            if (Path(directory) / ptd).exists() and ptd not in names:
                names.append(ptd)
        return files

    def load_program(self, path: str | Path) -> Any:
        """The ``.pte`` as an ``executorch.runtime.Program`` (the spec's contract: the export-time
        ``ExecutorchProgramManager`` cannot be rebuilt from the file). It keeps its path, to be saved again.

        Raises:
            ManifestError: the program or its ``.ptd`` is corrupt, unlisted, or holds what hfexport never writes
                (see :func:`.safety.check_program`).
        """
        from executorch.runtime import Runtime, Verification

        from .safety import check_program

        # before the runtime reads a byte: headers and segments in bounds, only our delegates and registered
        # operators, XNNPACK constants naming valid keys, and a .ptd only where the export lists it
        data = check_program(Path(path))
        program = Runtime.get().load_program(
            Path(path), verification=Verification.InternalConsistency, data_path=data
        )
        program.hfexport_path = str(path)
        return program


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
