"""``AotiRunner``: runs a compiled AOTInductor package on the flat tensors of the call."""

from __future__ import annotations

from typing import Any

import torch

from ...configs import ExportFormat
from ...errors import UnsupportedError
from ...metadata import ExportMetadata
from ...runner import ModelRunner
from .package import AotiProgram
from .target import target_problems

__all__ = ["AotiRunner"]


class AotiRunner(ModelRunner):
    """Runs an :class:`~hfexport.backends.aoti.package.AotiProgram`: the library's ``boxed_run`` on the flat inputs.

    The compiled code assumes the traced memory layout (contiguous tensors), so a non-contiguous input (a view into
    the generation loop's preallocated mask) is made contiguous first. An in-place cache write of the graph lands in
    the caller's cache tensors (contiguous, passed as they are).
    """

    export_format = ExportFormat.AOTI
    computes_with_torch = True  # its kernels use torch's OpenMP threads: the loop must not pin torch to one

    def __init__(self, program: AotiProgram, metadata: ExportMetadata):
        super().__init__(metadata)
        self.program = program
        self._run = program.load().loader.boxed_run

    @property
    def output_device(self) -> torch.device:
        return torch.device(self.metadata.export_device or "cpu")

    @classmethod
    def _create(cls, program: Any, metadata: ExportMetadata, device: Any = None, **runner_kwargs: Any) -> AotiRunner:
        if runner_kwargs:
            raise TypeError(f"AotiRunner takes no runner options, got {sorted(runner_kwargs)}")
        built = metadata.export_device or "cpu"
        if device is not None and torch.device(device).type != torch.device(built).type:
            raise UnsupportedError(
                f"an AOTInductor package runs where it was compiled ({built}), not on {device}: re-export with the "
                f"model on {device}"
            )
        if not isinstance(program, AotiProgram):
            raise UnsupportedError(f"AotiRunner runs an AotiProgram (from AotiExporter), got {type(program).__name__}")
        problems = target_problems(metadata.compiled_for)
        if problems:
            raise UnsupportedError(
                f"{program.package.name} cannot run on this machine: {'; '.join(problems)}. Re-export it here, or "
                "export with inductor_configs={'cpp.march': 'x86-64-v3', 'cpp.simdlen': 256} for older CPUs"
            )
        return cls(program, metadata)

    def run_flat(self, inputs: list[torch.Tensor], *, share_outputs: bool) -> list[Any]:
        flat = [t if t.is_contiguous() else t.contiguous() for t in inputs]
        with torch.no_grad():
            return self.checked(list(self._run(flat)))
