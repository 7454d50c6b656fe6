"""``DynamoExporter``: ``torch.export`` to an ``ExportedProgram``, saved as ``.pt2``."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ...pytrees import register_cache_classes
from . import shared_weights
from .safety import check_archive, example_inputs_are_safe, safe_globals
from ...configs import DynamoConfig, ExportFormat
from ...exporter import HfExporter

__all__ = ["DynamoExporter"]


class DynamoExporter(HfExporter):
    """Exporter that converts a ``PreTrainedModel`` to a ``torch.export`` ``ExportedProgram``.

    Example:
        >>> from hfexport.exporter_dynamo import DynamoExporter, DynamoConfig
        >>> exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
        >>> outputs = exported(**inputs)
        >>> exported.save_pretrained("exported")  # model.pt2, its metadata and the model config
    """

    export_format = ExportFormat.DYNAMO
    config_class = DynamoConfig
    checks_runtime_asserts = True  # (a data-dependent branch traced on the sample: capture.trace)

    def program_suffix(self) -> str:
        return ".pt2"

    def save_program(
        self, program: torch.export.ExportedProgram, path: str | Path, extra_files: dict[str, str] | None = None
    ) -> None:
        """``torch.export.save``; sample inputs that only a full unpickle could read back are left out.

        ``load_program`` refuses full unpickles, and a ``ModelOutput`` (e.g. an encoder-decoder's
        ``encoder_outputs``) is such an object; a static cache template (the spec's decode loop) is not.
        """
        if not example_inputs_are_safe(program, safe_globals()):
            program = copy.copy(program)
            program._example_inputs = None
        torch.export.save(program, str(path), extra_files=extra_files)

    def save_programs(self, programs: Mapping[str, Any], directory: Path) -> dict[str, list[str]]:
        """Several distinct programs (a dynamic-cache prefill and decode): the weights they share go once into
        ``shared_weights.safetensors`` beside the ``.pt2`` files (see :mod:`.shared_weights`)."""
        distinct = list({id(p): p for p in programs.values()}.values())
        if len(distinct) < 2:
            return super().save_programs(programs, directory)
        stripped, mappings, shared = shared_weights.split_shared(distinct)
        if not shared:
            return super().save_programs(programs, directory)
        from safetensors.torch import save_file

        save_file(shared, str(Path(directory) / shared_weights.SHARED_WEIGHTS_NAME))
        names = {id(p): f"{name}{self.program_suffix()}" for name, p in programs.items()}
        for program, copy_, mapping in zip(distinct, stripped, mappings):
            with warnings.catch_warnings():  # torch's packer on our zero-stride placeholders: true, and harmless
                warnings.filterwarnings("ignore", message="No complete tensor found in the group")
                self.save_program(copy_, Path(directory) / names[id(program)], shared_weights.extra_file(mapping))
        return {name: [names[id(p)], shared_weights.SHARED_WEIGHTS_NAME] for name, p in programs.items()}

    def load_program(self, path: str | Path) -> torch.export.ExportedProgram:
        """Load a ``.pt2``, refusing any pickled object outside the allowed cache/output classes.

        ``torch.export.load`` retries a failed ``weights_only`` unpickle of the sample inputs with a full unpickle,
        which can run code from a tampered file; we check every pickle in the archive first, then load with the
        transformers cache and output classes allowed, so that retry never happens.
        """
        register_cache_classes()
        allowed = safe_globals()
        check_archive(Path(path), allowed)
        extra = {shared_weights.EXTRA_FILE: ""}
        with torch.serialization.safe_globals(allowed):
            program = torch.export.load(str(path), extra_files=extra)
        if extra[shared_weights.EXTRA_FILE]:  # weights stored once for the folder's programs
            cache = self.__dict__.setdefault("_shared_weights", {})
            shared_weights.attach_shared(program, Path(path), extra[shared_weights.EXTRA_FILE], cache)
        return program
