"""``ExportQuantizer`` and ``CalibrationSet``: the contract every post-training quantizer follows.

A quantizer says which export formats it serves, which packages it needs (with the versions it is tested on), and
which of three things it rewrites: the eager module, before ``torch.export`` traces it (a quantized copy, the layers'
weights as tensor subclasses whose ops the trace records; :attr:`ExportQuantizer.quantizes_module`), the traced FX
graph (before any conversion, so every backend takes the result; :attr:`ExportQuantizer.quantizes_fx_graph`), or the
model a backend converts it into (``onnx_ir.Model``, ``openvino.Model``; neither flag). The exporter checks it up
front (:meth:`ExportQuantizer.validate_environment`), before any tracing, then calls
:meth:`ExportQuantizer.quantize_module` before each graph's trace or :meth:`ExportQuantizer.quantize` after it.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from .._versions import TESTED, check_packages, normalize, pip_line
from ..errors import UnsupportedError
from ..formats import ExportFormat, parse_format
from ..hf_model import LABEL_KEYS, OUTPUT_FLAGS
from ..workarounds.registry import applied_workarounds

if TYPE_CHECKING:
    import torch

__all__ = ["ExportQuantizer", "CalibrationSet", "LibraryArguments", "quantizer_workarounds", "traced_kwargs"]

class CalibrationSet:
    """Re-iterable, lazy view of calibration samples as model inputs.

    The samples are ``calibration_dataset``, or the export's own ``sample_inputs`` (with one warning, when first
    read) if there is none. They can be any mapping, such as a tokenizer's ``BatchEncoding``. ``transform`` maps each
    forward-kwargs sample to what the quantized model takes (traced kwargs, ONNX feeds, OpenVINO port feeds), one
    sample at a time, on every pass: a calibration library that reads the set twice sees every sample twice.

    Example:
        >>> calib = CalibrationSet(None, {"input_ids": ids}, transform=dict)
        >>> len(list(calib)), len(list(calib))  # one warning, two passes
        (1, 1)
    """

    def __init__(
        self,
        calibration_dataset: Iterable[dict[str, Any]] | None,
        sample_inputs: dict[str, Any],
        transform: Callable[[dict[str, Any]], Any],
    ):
        self.calibration_dataset = calibration_dataset
        self.sample_inputs = sample_inputs
        self.transform = transform
        self._warned = False

    def __iter__(self) -> Iterator[Any]:
        if self.calibration_dataset is None:
            if not self._warned:
                self._warned = True
                warnings.warn(
                    "no calibration_dataset given: calibrating on the export's own sample inputs, which rarely "
                    "represent real data; pass calibration_dataset=[...] to the quantizer for a usable int8 model",
                    stacklevel=2,
                )
            yield self.transform(dict(self.sample_inputs))
            return
        for sample in self.calibration_dataset:
            yield self.transform(dict(sample))

    def __len__(self) -> int:
        if self.calibration_dataset is None:
            return 1
        return len(self.calibration_dataset)  # type: ignore[arg-type]  # a DataLoader has one; a generator does not


@dataclasses.dataclass
class LibraryArguments:
    """Arguments of a quantization library's function; a field left ``None`` keeps the library's default."""

    def to_kwargs(self) -> dict[str, Any]:
        """The fields that are set, as keyword arguments of the library's function."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) is not None}


class ExportQuantizer:
    """Base class for post-training quantizers applied during export.

    Subclasses set :attr:`supported_formats`, :attr:`required_packages` (distribution -> minimum version) and
    :attr:`quantizes_fx_graph` or :attr:`quantizes_module`, and implement :meth:`quantize` (the FX graph or the
    backend's model) or :meth:`quantize_module` (the eager module, before the trace).

    Args:
        calibration_dataset: Input dicts the quantizer calibrates on: a list, or a ``DataLoader`` whose batches
            collate to model inputs. For ``export_for_generation`` they are ``generate`` kwargs, captured into one
            calibration set per component. ``None`` calibrates on the export's sample inputs, with a warning.
        weight_only_modules: Regular expressions (``re.search``) over module paths (``model.layers.0.mlp.down_proj``,
            ``model.embed_tokens``): the layers they match keep float activations and get int8 weights, one
            symmetric scale per output channel (per embedding row). For the layers whose inputs carry large
            activation outliers (the MLPs of Llama-family models), which per-tensor int8 activations lose. Empty
            (the default): the library's own choice for every layer.

    Example:
        >>> class Identity(ExportQuantizer):
        ...     supported_formats = (ExportFormat.DYNAMO,)
        ...     quantizes_fx_graph = True
        ...     def quantize(self, model, sample_inputs, export_format):
        ...         return model
        >>> DynamoConfig(quantizer=Identity())
    """

    supported_formats: ClassVar[tuple[ExportFormat, ...]] = ()
    required_packages: ClassVar[dict[str, str]] = {}
    quantizes_fx_graph: ClassVar[bool] = False
    #: quantizes the eager module before the trace (:meth:`quantize_module`), for every graph an export traces
    quantizes_module: ClassVar[bool] = False
    #: each output row of a weight is quantized from that row alone (no calibration, no per-tensor statistics), so a
    #: backend may concatenate weights that read one activation (q/k/v) before quantizing and get the same codes
    row_independent: ClassVar[bool] = False

    def __init__(
        self, calibration_dataset: Iterable[dict[str, Any]] | None = None, *, weight_only_modules: Iterable[str] = ()
    ):
        self.calibration_dataset = calibration_dataset
        self.weight_only_modules = tuple(weight_only_modules)

    @property
    def tested_versions(self) -> dict[str, str]:
        """The versions of :attr:`required_packages` this quantizer is tested on."""
        pins = {normalize(k): v for k, v in TESTED.items()}
        return {name: pins[normalize(name)] for name in self.required_packages if normalize(name) in pins}

    def with_calibration(self, calibration_dataset: Iterable[dict[str, Any]]) -> ExportQuantizer:
        """A copy of this quantizer that calibrates on ``calibration_dataset``."""
        clone = copy.copy(self)
        clone.calibration_dataset = calibration_dataset
        return clone

    def validate_environment(self, export_format: ExportFormat | str) -> None:
        """Raise ``ValueError`` (an :class:`~hfexport.UnsupportedError`) for a format this quantizer cannot serve, :class:`MissingPackageError` for a missing
        or too-old package; warn once when a package differs from the version it is tested on."""
        fmt = parse_format(export_format)
        if fmt not in self.supported_formats:
            raise UnsupportedError(  # a ValueError
                f"{type(self).__name__} cannot quantize a {str(fmt)!r} export; it quantizes "
                f"{', '.join(repr(str(f)) for f in self.supported_formats)} exports"
                + self.unsupported_hint(fmt)
            )
        self.check_options(fmt)
        check_packages(type(self).__name__, self.required_packages, self.tested_versions,
                       lambda names: _pip(names[0]))

    def unsupported_hint(self, export_format: ExportFormat | str) -> str:
        """What to use instead, appended to the ``ValueError`` for an unsupported format."""
        return ""

    def check_options(self, export_format: ExportFormat | str) -> None:
        """Raise ``ValueError`` for options this quantizer cannot honour on ``export_format`` (before tracing)."""

    def read_program(self, program: Any) -> None:
        """Called with the traced ``ExportedProgram`` before the backend converts it, for a quantizer of the converted
        model that needs what only the program knows (the module each op comes from)."""

    def quantize(self, model: Any, sample_inputs: dict[str, Any], export_format: ExportFormat) -> Any:
        """Quantize ``model`` (the ``ExportedProgram`` if :attr:`quantizes_fx_graph`, else the backend's model) and
        return the result, calibrated on ``calibration_dataset``, or on the export's ``sample_inputs``."""
        raise NotImplementedError(f"{type(self).__name__} must implement quantize()")

    def quantize_module(
        self, module: torch.nn.Module, sample_inputs: dict[str, Any], export_format: ExportFormat
    ) -> torch.nn.Module:
        """A quantized copy of ``module`` (the model, or the generation component about to be traced), for a
        quantizer with :attr:`quantizes_module`; ``module`` itself, the user's model, is never changed."""
        raise NotImplementedError(f"{type(self).__name__} must implement quantize_module()")

    def traced_calibration(self, sample_inputs: dict[str, Any]) -> CalibrationSet:
        """Calibration samples as the traced kwargs, for FX-graph quantizers: each sample keeps the keys the graph
        was traced with (output flags and labels dropped), deep-copied, since a forward writes a cache in place."""
        keys = [k for k in sample_inputs if _is_traced_key(k)]
        return CalibrationSet(self.calibration_dataset, sample_inputs, lambda s: traced_kwargs(s, keys))

    def to_dict(self) -> dict[str, Any]:
        """A description for the saved export config (not meant to rebuild the quantizer)."""
        out: dict[str, Any] = {"type": type(self).__name__, "calibrated": self.calibration_dataset is not None}
        if getattr(self, "weight_only_modules", ()):
            out["weight_only_modules"] = list(self.weight_only_modules)
        config = getattr(self, "config", None)
        if config is not None:
            out["config"] = {"type": type(config).__name__, **{k: repr(v) for k, v in config.to_kwargs().items()}}
        return out

    def __repr__(self) -> str:
        config = getattr(self, "config", None)
        return f"{type(self).__name__}({'' if config is None else repr(config)})"


@contextlib.contextmanager
def quantizer_workarounds(ids: Iterable[str], model: Any, inputs: dict | None = None) -> Iterator[list[str]]:
    """Apply the registered workarounds ``ids`` (hfexport.workarounds) that are in their version range and apply to
    ``model`` (the model a quantizer is given), for the duration of a quantization library's call; yields the ids
    that fired. A quantizer runs after the trace, out of the trace's workaround scope, so it applies its own."""
    with applied_workarounds(None, model, inputs or {}, ids=ids) as fired:
        yield fired


def _is_traced_key(key: str) -> bool:
    return key not in LABEL_KEYS and key not in OUTPUT_FLAGS


def traced_kwargs(sample: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """``sample`` restricted to the traced ``keys``, in their order, deep-copied (a forward updates a cache in place).

    Raises:
        ValueError: The sample lacks a traced input (e.g. ``generate`` kwargs given to a single-graph export).
    """
    missing = [k for k in keys if k not in sample]
    if missing:
        raise ValueError(
            f"a calibration sample lacks the traced inputs {missing} (it has {sorted(sample)}); calibration samples "
            "are the exported forward's kwargs (export_for_generation takes generate kwargs and captures them)"
        )
    return copy.deepcopy({k: sample[k] for k in keys})


def _pip(name: str) -> str:
    try:
        exact = pip_line([name])
    except ValueError:
        exact = f"pip install {name}"
    return f"pip install 'hfexport[quantization]'   # or: {exact}"
