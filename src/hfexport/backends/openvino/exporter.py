"""``OpenVINOExporter``: ``torch.export`` -> ``openvino.convert_model`` -> (quantized or merged fp32 projections) ->
(fp16 weights) -> (stateful variables)."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ...configs import ExportFormat, OpenVINOConfig
from ...exporter import HfExporter
from ...stages import ExportStep
from ...metadata import ExportMetadata

__all__ = ["OpenVINOExporter"]

logger = logging.getLogger(__name__)

class OpenVINOExporter(HfExporter):
    """Exporter that converts a ``PreTrainedModel`` to OpenVINO IR (an ``openvino.Model``), run on OpenVINO Runtime.

    With ``stateful=True`` (the default) a decode graph keeps its cache in OpenVINO variables: the runner carries
    it from call to call, starts from the caller's cache at each new sequence, and reorders it through ``beam_idx``.

    Example:
        >>> from hfexport.exporter_openvino import OpenVINOExporter, OpenVINOConfig
        >>> exported = OpenVINOExporter().export(model, inputs, config=OpenVINOConfig(dynamic=True))
        >>> outputs = exported(**inputs)  # on OpenVINO Runtime, fp32 for an fp32 model
        >>> ov_model = exported.program  # an openvino.Model
        >>> exported.save_pretrained("exported")  # openvino_model.xml / .bin, its metadata and the model config
    """

    export_format = ExportFormat.OPENVINO
    config_class = OpenVINOConfig
    required_packages = {"openvino": "2025.0"}
    package_extra = "openvino"
    program_filename = "openvino_model"

    trace_packages = ("openvino",)

    def lower(self, program: torch.export.ExportedProgram, metadata: ExportMetadata, step: ExportStep) -> Any:
        """``openvino.convert_model`` of the traced program (inside the workaround scope: the OpenVINO workarounds
        wrap convert_model), its ports named from the signature."""
        from .convert import convert, name_ports

        start = time.perf_counter()
        converted = convert(program)
        logger.info("openvino.convert_model: %.1fs", time.perf_counter() - start)
        return name_ports(converted, metadata, program)

    def finish(self, lowered: Any, metadata: ExportMetadata, step: ExportStep) -> Any:
        """Quantize with a quantizer that works on OpenVINO models (NNCF), merge the fp32 projections that read one
        activation (:mod:`.projections`), compress weights to fp16 (``compress_to_fp16``) and fold state into
        variables (``stateful``)."""
        from .projections import fuse_projections

        if getattr(getattr(step.config, "quantizer", None), "row_independent", False):
            # the CPU plugin merges the projections of compressed weights only in some layouts (SmolLM2's int4 and
            # int8-group exports kept 210 products): merge the fp32 weights first, the quantizer's rows are the same
            fuse_projections(lowered)
        model = self.quantize_lowered(lowered, step)
        fuse_projections(model)
        if step.config.compress_to_fp16:
            from openvino._offline_transformations import compress_model_transformation

            compress_model_transformation(model)
        if step.config.stateful:
            from .stateful import make_stateful

            make_stateful(model, metadata)
        return model

    def serves_prefill(self, decode: Any, prefill_inputs: Mapping[str, Any], multi_token_decode: bool) -> bool:
        """As the base class (a multi-token decode over a static cache), and also a stateful multi-token decode over
        a growing cache: its variables start empty at each sequence, so the prompt is its first call. One IR then
        serves the whole generation, as optimum-intel writes it, and the CPU plugin fuses each layer's cache
        ``ReadValue -> Concat -> SDPA -> Assign`` into its stateful attention (ScaledDotProductAttentionWithKVCache),
        which appends in place; the static cache's scatter, transposes and GQA broadcasts cost SmolLM2 ~40 % of a
        decode step (profiled with PERF_COUNT)."""
        if super().serves_prefill(decode, prefill_inputs, multi_token_decode):
            return True
        from .stateful import BEAM_IDX

        metadata = decode.metadata
        if not multi_token_decode or metadata.cache_type != "DynamicCache":
            return False
        if not any(BEAM_IDX in port.get_names() for port in decode.program.inputs):
            return False  # stateless: the caller's cache is an input, and a graph traced with a past may not take none
        return metadata.takes_prompt(prefill_inputs)

    # --- files --------------------------------------------------------------------------------------------------

    def program_suffix(self) -> str:
        return ".xml"

    def program_files(self, filename: str) -> list[str]:
        return [filename, str(Path(filename).with_suffix(".bin"))]

    def save_programs(self, programs: Mapping[str, Any], directory: Path) -> dict[str, list[str]]:
        """One ``openvino_model.xml``/``.bin`` for a single program (the spec's names); a program serving several
        components (a static-cache prefill run by the decode graph) is written once."""
        distinct = {id(p): p for p in programs.values()}
        if len(distinct) == 1:
            filename = f"{self.program_filename}{self.program_suffix()}"
            self.save_program(next(iter(distinct.values())), Path(directory) / filename)
            return {name: self.program_files(filename) for name in programs}
        return super().save_programs(programs, directory)

    def save_program(self, program: Any, path: str | Path) -> None:
        """Write ``path`` (the graph, ``.xml``) and its weights (``.bin``); already-compressed weights stay as they
        are (``compress_to_fp16`` is applied at export, so that the in-memory model runs as the saved one)."""
        import openvino as ov

        ov.save_model(program, str(path), compress_to_fp16=False)

    def load_program(self, path: str | Path) -> Any:
        """Read the IR at ``path`` and its ``.bin``, after :func:`.safety.check_ir` (an IR of standard opsets, its
        weights a listed file of the export, every constant inside them); the weights file is passed explicitly.

        Raises:
            ManifestError: the IR is corrupt, names something outside its export, or needs an extension.
        """
        import openvino as ov

        from .safety import check_ir

        weights = check_ir(Path(path))
        return ov.Core().read_model(str(path), str(weights))
