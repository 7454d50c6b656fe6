"""``ExportQuantizer`` and ``CalibrationSet``: the contract every post-training quantizer follows.

A quantizer says which export formats it serves, which packages it needs, and whether it rewrites the
``torch.export`` FX graph (before any conversion, so every backend takes the result) or the model a backend
converts it into. The exporter checks it up front (:meth:`ExportQuantizer.validate_environment`), before tracing.
"""

from __future__ import annotations

import copy
import importlib.metadata
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar

from packaging.version import Version

from .._versions import pip_line
from ..configs import ExportFormat, parse_format
from ..errors import MissingPackageError

__all__ = ["ExportQuantizer", "CalibrationSet"]


class CalibrationSet:
    """Re-iterable, lazy view of calibration samples as model inputs.

    The samples are ``calibration_dataset``, or the export's own ``sample_inputs`` (with one warning, when first
    read) if there is none. ``transform`` maps each forward-kwargs sample to what the quantized model takes.

    Example:
        >>> calib = CalibrationSet(None, {"input_ids": ids}, transform=dict)
        >>> len(list(calib))
        1
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
                    "represent real data; pass calibration_dataset=[...] for a usable int8 model",
                    stacklevel=2,
                )
            yield self.transform(dict(self.sample_inputs))
            return
        for sample in self.calibration_dataset:
            yield self.transform(dict(sample))


class ExportQuantizer:
    """Base class for post-training quantizers applied during export.

    Args:
        calibration_dataset: Input dicts (a list, or a ``DataLoader`` whose batches collate to model inputs).
            ``None`` calibrates on the export's sample inputs, with a warning.
    """

    supported_formats: ClassVar[tuple[ExportFormat, ...]] = ()
    required_packages: ClassVar[dict[str, str]] = {}
    quantizes_fx_graph: ClassVar[bool] = False

    def __init__(self, calibration_dataset: Iterable[dict[str, Any]] | None = None):
        self.calibration_dataset = calibration_dataset

    def with_calibration(self, calibration_dataset: Iterable[dict[str, Any]]) -> ExportQuantizer:
        """A copy of this quantizer that calibrates on ``calibration_dataset``."""
        clone = copy.copy(self)
        clone.calibration_dataset = calibration_dataset
        return clone

    def validate_environment(self, export_format: ExportFormat | str) -> None:
        """Raise ``ValueError`` for a format this quantizer cannot serve, :class:`MissingPackageError` for a missing
        or too-old package; warn when a package differs from the version it is tested on."""
        fmt = parse_format(export_format)
        if fmt not in self.supported_formats:
            raise ValueError(
                f"{type(self).__name__} cannot quantize a {str(fmt)!r} export; it supports "
                f"{[str(f) for f in self.supported_formats]}"
            )
        for name, minimum in self.required_packages.items():
            try:
                found = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                raise MissingPackageError(name, type(self).__name__, pip_line([name])) from None
            if minimum and Version(found) < Version(minimum):
                raise MissingPackageError(name, type(self).__name__, pip_line([name]), found, minimum)

    def quantize(self, model: Any, sample_inputs: dict[str, Any], export_format: ExportFormat) -> Any:
        """Quantize ``model`` (the FX graph if :attr:`quantizes_fx_graph`, else the backend's model)."""
        raise NotImplementedError(f"{type(self).__name__} must implement quantize()")

    def traced_calibration(self, sample_inputs: dict[str, Any]) -> CalibrationSet:
        """Calibration samples as the traced kwargs, for FX-graph quantizers."""
        keys = list(sample_inputs)
        return CalibrationSet(
            self.calibration_dataset, sample_inputs, lambda s: {k: s[k] for k in keys if k in s}
        )

    def to_dict(self) -> dict[str, Any]:
        """A description for the saved export config (not meant to rebuild the quantizer)."""
        return {"type": type(self).__name__, "calibrated": self.calibration_dataset is not None}
