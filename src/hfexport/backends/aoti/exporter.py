"""``AotiExporter``: the ``torch.export`` graph compiled ahead of time by AOTInductor into a ``.pt2`` package."""

from __future__ import annotations

import shutil
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch

from ...configs import AotiConfig, ExportFormat
from ...errors import UnsupportedError
from ...exporter import HfExporter
from ...metadata import ExportMetadata
from ...pytrees import register_cache_classes
from ...stages import ExportStep
from .package import (WEIGHTS_NAME, AotiProgram, check_package, compile_package, inductor_options, load_weights,
                      save_weights)
from .target import build_target

__all__ = ["AotiExporter"]


class AotiExporter(HfExporter):
    """Exporter that compiles a ``PreTrainedModel``'s ``torch.export`` graph with AOTInductor.

    The package is machine code for this CPU and this torch (see :mod:`.target`); loading one runs it, so
    ``ExportedModel.from_pretrained`` loads an AOTI folder only with ``trust_remote_code=True``.

    Example:
        >>> from hfexport.exporter_aoti import AotiExporter, AotiConfig
        >>> exported = AotiExporter().export(model, inputs, config=AotiConfig(dynamic=True))
        >>> exported(**inputs).logits
        >>> exported.save_pretrained("compiled")  # model.pt2, aoti_weights.safetensors, the configs
    """

    export_format = ExportFormat.AOTI
    config_class = AotiConfig
    #: loading a saved export loads (and runs) the shared library inside it
    loads_machine_code = True

    def program_suffix(self) -> str:
        return ".pt2"

    def check(self, step: ExportStep) -> None:
        if shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("clang++") is None:
            raise UnsupportedError(
                "AOTInductor compiles the graph to C++ and needs a C++ compiler on PATH (g++ or clang++), and none "
                "was found: install one (e.g. apt install g++), or export with DynamoExporter instead"
            )
        devices = {p.device.type for p in step.model.parameters()} or {"cpu"}
        if devices - {"cpu", "cuda"}:
            raise UnsupportedError(f"AOTInductor compiles for cpu or cuda; the model's weights are on {devices}")

    def export_program(
        self, model: torch.nn.Module, sample_inputs: MutableMapping[str, Any], config: AotiConfig
    ) -> tuple[AotiProgram, ExportMetadata]:
        """The template's stages (the graph as Dynamo exports it), then a ``compile`` stage: AOTInductor."""
        program, metadata = self.export_stages(model, sample_inputs, config)
        component = getattr(self, "_component", "model")
        options = inductor_options(self._gemm(config, component), config.inductor_configs)
        with self._clock().stage("compile", component, model, sample_inputs), torch._inductor.config.patch(options):
            compiled = compile_package(program, options)
            metadata.compiled_for = build_target(metadata.export_device or "cpu", options.get("cpp.march"))
        return compiled, metadata

    @staticmethod
    def _gemm(config: AotiConfig, component: str) -> str:
        """``gemm="auto"``: the micro-kernels for the decode graph (a few rows per GEMM), MKL for the rest."""
        if config.gemm != "auto":
            return config.gemm
        return "cpp" if component == "decode" else "aten"

    def serves_prefill(self, decode: Any, prefill_inputs: Mapping[str, Any], multi_token_decode: bool) -> bool:
        """With ``gemm="auto"`` the prompt gets a package of its own, on MKL's GEMM (see :class:`AotiConfig`)."""
        if decode.metadata.export_config.get("gemm", "auto") == "auto":
            return False
        return super().serves_prefill(decode, prefill_inputs, multi_token_decode)

    def save_program(self, program: AotiProgram, path: str | Path) -> None:
        """The package to ``path``, its weights to ``aoti_weights.safetensors`` beside it."""
        self.save_programs({Path(path).stem: program}, Path(path).parent, names={id(program): Path(path).name})

    def save_programs(self, programs: Mapping[str, AotiProgram], directory: Path,
                      names: dict[int, str] | None = None) -> dict[str, list[str]]:
        """Each distinct package as ``<component>.pt2``; the weights of all of them once, in one file."""
        names = names or {id(p): f"{name}{self.program_suffix()}" for name, p in programs.items()}
        distinct = list({id(p): p for p in programs.values()}.values())
        for program in distinct:
            shutil.copyfile(program.package, Path(directory) / names[id(program)])
        save_weights(distinct, [names[id(p)] for p in distinct], Path(directory))
        return {name: [names[id(p)], WEIGHTS_NAME] for name, p in programs.items()}

    def program_files(self, filename: str) -> list[str]:
        return [filename, WEIGHTS_NAME]

    def load_program(self, path: str | Path) -> AotiProgram:
        """Check the package's members and read its weights; the library itself is loaded by the runner, after
        it has checked that this machine can run it."""
        register_cache_classes()
        path = Path(path)
        check_package(path)
        cache = self.__dict__.setdefault("_weights", {})
        return AotiProgram(path, load_weights(path, cache))
