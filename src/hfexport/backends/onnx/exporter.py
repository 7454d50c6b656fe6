"""``OnnxExporter``: ``torch.export`` -> ``torch.onnx.export`` (dynamo path) -> onnxscript optimiser -> ORT fusions."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

import torch

from ...configs import ExportFormat, OnnxConfig
from ...exporter import HfExporter
from ...stages import ExportStep
from ...metadata import ExportMetadata
from . import storage
from .convert import name_graph_io, opset_scope, to_onnx

__all__ = ["OnnxExporter"]

logger = logging.getLogger(__name__)

class OnnxExporter(HfExporter):
    """Exporter that converts a ``PreTrainedModel`` to an ONNX graph (an ``onnx_ir.Model``), run on ONNX Runtime.

    Example:
        >>> from hfexport.exporter_onnx import OnnxExporter, OnnxConfig
        >>> exported = OnnxExporter().export(model, inputs, config=OnnxConfig(dynamic=True))
        >>> outputs = exported(**inputs)  # on ONNX Runtime
        >>> onnx_model = exported.program  # an onnx_ir.Model
        >>> exported.save_pretrained("exported")  # model.onnx, model.onnx.data, its metadata and the model config
    """

    export_format = ExportFormat.ONNX
    config_class = OnnxConfig
    # opset 23/24 (Attention, the default opset) needs onnx >= 1.18 and onnxruntime >= 1.23; tested: _versions.TESTED
    required_packages = {"onnx": "1.18", "onnxscript": "0.5", "onnx-ir": "0.1.12", "onnxruntime": "1.23"}
    package_extra = "onnx"

    trace_packages = ("onnx", "onnxscript", "onnx-ir", "onnxruntime")

    def export_program(
        self, model: torch.nn.Module, sample_inputs: MutableMapping[str, Any], config: OnnxConfig
    ) -> tuple[Any, ExportMetadata]:
        with opset_scope(config.opset_version):  # the opset torch.onnx's translations are registered for
            return self.export_stages(model, sample_inputs, config)

    def lower(self, program: torch.export.ExportedProgram, metadata: ExportMetadata, step: ExportStep) -> Any:
        """``torch.onnx.export`` of the traced program (inside the workaround scope: the ONNX workarounds patch
        torch.onnx)."""
        start = time.perf_counter()
        converted = to_onnx(program, step.config.opset_version)
        logger.info("torch.onnx.export: %.1fs", time.perf_counter() - start)
        return converted

    def finish(self, lowered: Any, metadata: ExportMetadata, step: ExportStep) -> Any:
        """Optimise (and, with ``ort_fusions``, fuse) the converted graph, name its I/O from the signature, then
        quantize it with a quantizer that works on ONNX graphs."""
        config = step.config
        timings = {}
        if config.optimize:
            from .optimize import optimize

            start = time.perf_counter()
            optimize(lowered)
            timings["optimize"] = time.perf_counter() - start
        if config.ort_fusions:
            from .fusions import fuse_for_onnxruntime

            start = time.perf_counter()
            fuse_for_onnxruntime(lowered, config.ort_fusions)
            timings["fuse"] = time.perf_counter() - start
        name_graph_io(lowered, metadata)
        if timings:
            logger.info("ONNX graph passes: %s", ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
        start = time.perf_counter()
        quantized = self.quantize_lowered(lowered, step)
        if quantized is not lowered:
            timings["quantize"] = time.perf_counter() - start
        step.parts.update(timings)
        return quantized

    # --- files --------------------------------------------------------------------------------------------------

    def program_suffix(self) -> str:
        return ".onnx"

    def program_files(self, filename: str) -> list[str]:
        return [filename, storage.data_name_for(filename)]

    def save_program(self, program: Any, path: str | Path) -> None:
        """Write ``path`` (the graph) and ``<path>.data`` (every weight)."""
        path = Path(path)
        storage.save_models({path.name: program}, path.parent, storage.data_name_for(path.name))

    def save_programs(self, programs: Mapping[str, Any], directory: Path) -> dict[str, list[str]]:
        """Write several components with one shared data file: a weight the graphs share is stored once. Components
        served by the same program object (a static-cache prefill run by the decode graph) share its file."""
        if len(programs) == 1:
            return super().save_programs(programs, directory)
        # a program serving several components is saved once, named after the last of them (the decode graph)
        files = {id(program): f"{name}{self.program_suffix()}" for name, program in programs.items()}
        to_write = {files[id(program)]: program for program in programs.values()}
        storage.save_models(to_write, directory, storage.SHARED_DATA_NAME)
        return {name: [files[id(p)], storage.SHARED_DATA_NAME] for name, p in programs.items()}

    def load_program(self, path: str | Path) -> Any:
        return storage.load_model(path)
