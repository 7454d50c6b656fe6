"""Export configs: one dataclass per backend, validated as a whole, saved as plain JSON.

Every problem with a config is collected and raised together as one :class:`~hfexport.errors.ConfigError`, so a
user fixes a config in one round. ``dynamic_shapes`` holding ``torch.export.Dim`` objects is stored as data
(name/min/max per dim) so that a saved config reloads to an equivalent one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from .errors import ConfigError
from .formats import ExportFormat, parse_format

__all__ = [
    "ExportFormat",
    "ExportConfigMixin",
    "DynamoConfig",
    "OnnxConfig",
    "ExecutorchConfig",
    "OpenVINOConfig",
    "AotiConfig",
    "dynamic_shapes_to_data",
    "dynamic_shapes_from_data",
]


# --- dynamic shapes as data -------------------------------------------------------------------------------------

_HINTS = ("auto", "static", "dynamic")


def _dim_to_data(spec: Any) -> Any:
    import torch

    if spec is None or isinstance(spec, int):
        return spec
    hint_type = type(torch.export.Dim.AUTO)
    if isinstance(spec, hint_type):
        # compared by kind, not identity: Dim.AUTO(min=.., max=..) is a new object with bounds
        name = spec.type.name.lower()
        bounds = {k: int(v) for k in ("min", "max") if (v := getattr(spec, k, None)) is not None}
        return {"hint": name, **bounds} if bounds else name
    # torch >= 2.6 makes Dim("x") an instance of torch.export.Dim; older versions made a class
    is_named_dim = isinstance(spec, torch.export.Dim) or isinstance(spec, type)
    if is_named_dim and hasattr(spec, "__name__") and hasattr(spec, "min"):
        if hasattr(spec, "root") and hasattr(spec, "fn"):
            raise TypeError(f"derived dim {spec.__name__} cannot be saved; use Dim.AUTO or a plain Dim")
        out = {"dim": spec.__name__, "min": int(spec.min)}
        max_ = getattr(spec, "max", None)
        if max_ is not None and max_ < 2**62:
            out["max"] = int(max_)
        return out
    raise TypeError(f"unsupported dim spec {spec!r}")


def dynamic_shapes_to_data(shapes: Any) -> Any:
    """Turn a ``dynamic_shapes`` structure into JSON-able data.

    Per-tensor dim maps ``{0: Dim(...)}`` become ``{"__dims__": [[0, {...}]]}`` so they stay apart from
    kwarg-name dicts; ``Dim.AUTO``/``STATIC``/``DYNAMIC`` become ``"auto"``/``"static"``/``"dynamic"``.

    Example:
        >>> import torch
        >>> batch = torch.export.Dim("batch", min=1, max=8)
        >>> dynamic_shapes_to_data({"input_ids": {0: batch}})
        {'input_ids': {'__dims__': [[0, {'dim': 'batch', 'min': 1, 'max': 8}]]}}
    """
    if isinstance(shapes, Mapping):
        if shapes and all(isinstance(k, int) for k in shapes):
            return {"__dims__": [[k, _dim_to_data(v)] for k, v in shapes.items()]}
        return {str(k): dynamic_shapes_to_data(v) for k, v in shapes.items()}
    if isinstance(shapes, tuple):
        return {"__tuple__": [dynamic_shapes_to_data(v) for v in shapes]}
    if isinstance(shapes, list):
        return [dynamic_shapes_to_data(v) for v in shapes]
    return _dim_to_data(shapes)


def dynamic_shapes_from_data(data: Any, _dims: dict | None = None) -> Any:
    """Inverse of :func:`dynamic_shapes_to_data`; dims with one name become one ``Dim`` object again."""
    import torch

    dims = {} if _dims is None else _dims
    if isinstance(data, Mapping):
        if "__dims__" in data:
            return {int(k): dynamic_shapes_from_data(v, dims) for k, v in data["__dims__"]}
        if "__tuple__" in data:
            return tuple(dynamic_shapes_from_data(v, dims) for v in data["__tuple__"])
        if "hint" in data:
            hint = data["hint"]
            if hint not in _HINTS:
                raise TypeError(f"unknown dim hint {hint!r}; expected one of {_HINTS}")
            bounds = {k: data[k] for k in ("min", "max") if data.get(k) is not None}
            return getattr(torch.export.Dim, hint.upper())(**bounds)
        if "dim" in data:
            key = (data["dim"], data.get("min"), data.get("max"))
            if key not in dims:
                kwargs = {k: data[k] for k in ("min", "max") if data.get(k) is not None}
                dims[key] = torch.export.Dim(data["dim"], **kwargs)
            return dims[key]
        return {k: dynamic_shapes_from_data(v, dims) for k, v in data.items()}
    if isinstance(data, list):
        return [dynamic_shapes_from_data(v, dims) for v in data]
    if isinstance(data, str):
        if data not in _HINTS:
            raise TypeError(f"unknown dim hint {data!r}; expected one of {_HINTS}")
        return getattr(torch.export.Dim, data.upper())
    return data


# --- configs -----------------------------------------------------------------------------------------------------


def _type_name(tp: Any) -> str:
    return tp if isinstance(tp, str) else getattr(tp, "__name__", str(tp))


@dataclasses.dataclass
class ExportConfigMixin:
    """Base of the export configs: validation, ``to_dict`` / ``from_dict`` / ``to_json_string``.

    Subclasses declare their fields as dataclass fields and may extend :meth:`_problems`.
    """

    # field name -> (accepted types, allowed values or None); checked in __post_init__
    _checks: ClassVar[dict[str, tuple[tuple[type, ...], tuple | None]]] = {}

    def __post_init__(self) -> None:
        problems = self._problems()
        if problems:
            raise ConfigError(type(self).__name__, problems)

    def _problems(self) -> list[str]:
        problems = []
        fmt = getattr(self, "export_format", None)
        if parse_format(fmt) != parse_format(type(self).__dataclass_fields__["export_format"].default):
            expected = type(self).__dataclass_fields__["export_format"].default
            problems.append(f"export_format: {type(self).__name__} is for {str(expected)!r}, got {str(fmt)!r}")
        for name, (types, allowed) in self._all_checks().items():
            value = getattr(self, name)
            if not isinstance(value, types) or (bool not in types and isinstance(value, bool) and int in types):
                names = " or ".join("None" if t is type(None) else _type_name(t) for t in types)
                problems.append(f"{name}: expected {names}, got {type(value).__name__} {value!r}")
            elif allowed is not None and value not in allowed:
                problems.append(f"{name}: {value!r} is not one of {list(allowed)}")
        return problems

    @classmethod
    def _all_checks(cls) -> dict:
        checks: dict = {}
        for klass in reversed(cls.__mro__):
            checks.update(klass.__dict__.get("_checks", {}))
        return checks

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; ``from_dict`` of it gives an equal config (quantizers are described, not rebuilt)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "export_format":
                value = str(value)
            elif f.name == "dynamic_shapes" and value is not None:
                value = dynamic_shapes_to_data(value)
            elif f.name == "quantizer" and value is not None:
                value = value.to_dict()
            out[f.name] = value
        return out

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ExportConfigMixin:
        """Build a config from a dict, as saved by :meth:`to_dict`; every problem is reported at once."""
        if not isinstance(values, Mapping):
            raise ConfigError(cls.__name__, [f"expected a dict, got {type(values).__name__}"])
        names = {f.name for f in dataclasses.fields(cls)}
        problems = [
            f"unknown key {k!r}; allowed keys: {sorted(names)}" for k in values if k not in names
        ]
        kwargs = {k: v for k, v in values.items() if k in names}
        if isinstance(kwargs.get("dynamic_shapes"), Mapping | list):
            try:
                kwargs["dynamic_shapes"] = dynamic_shapes_from_data(kwargs["dynamic_shapes"])
            except (TypeError, ValueError, KeyError) as e:
                del kwargs["dynamic_shapes"]  # reported here, once
                problems.append(f"dynamic_shapes: {e}")
        if isinstance(kwargs.get("quantizer"), Mapping):
            del kwargs["quantizer"]  # reported here, once; the constructor would report it again
            problems.append(
                "quantizer: a saved quantizer description cannot be rebuilt from a dict; pass an ExportQuantizer"
            )
        if "export_format" in kwargs:
            kwargs["export_format"] = parse_format(kwargs["export_format"])
        try:
            config = cls(**kwargs)
        except ConfigError as e:
            raise ConfigError(cls.__name__, problems + e.problems) from None
        if problems:
            raise ConfigError(cls.__name__, problems)
        return config


def _quantizer_type() -> type:
    from .quantizers.base import ExportQuantizer

    return ExportQuantizer


@dataclasses.dataclass
class DynamoConfig(ExportConfigMixin):
    """Configuration for exporting with ``torch.export``.

    Args:
        dynamic: Export with symbolic shapes: every tensor dim becomes ``Dim.AUTO`` unless ``dynamic_shapes`` is set.
        strict: Trace with TorchDynamo (``strict=True``) instead of the non-strict Python-level trace.
        dynamic_shapes: Explicit per-input dynamic shapes passed to ``torch.export``; wins over ``dynamic``.
        prefer_deferred_runtime_asserts_over_guards: Turn data-dependent guards into runtime asserts.
        quantizer: A post-training quantizer applied during export.

    Example:
        >>> DynamoConfig(dynamic=True).to_dict()["dynamic"]
        True
    """

    export_format: ExportFormat = ExportFormat.DYNAMO
    dynamic: bool = False
    strict: bool = False
    dynamic_shapes: dict[str, Any] | None = None
    prefer_deferred_runtime_asserts_over_guards: bool = False
    quantizer: Any = None

    _checks: ClassVar = {
        "dynamic": ((bool,), None),
        "strict": ((bool,), None),
        "dynamic_shapes": ((dict, list, tuple, type(None)), None),
        "prefer_deferred_runtime_asserts_over_guards": ((bool,), None),
    }

    def _problems(self) -> list[str]:
        problems = super()._problems()
        if isinstance(self.dynamic_shapes, dict | list | tuple):
            # the export records its config as JSON: refuse now what would only fail after tracing
            try:
                dynamic_shapes_to_data(self.dynamic_shapes)
            except TypeError as e:
                problems.append(f"dynamic_shapes: {e}")
        if self.quantizer is not None and not isinstance(self.quantizer, _quantizer_type()):
            problems.append(f"quantizer: expected an ExportQuantizer or None, got {type(self.quantizer).__name__}")
        return problems


_ORT_FUSIONS = ("cpu", "cuda", "webgpu", "dml")


@dataclasses.dataclass
class OnnxConfig(DynamoConfig):
    """Configuration for exporting to ONNX (``torch.onnx.export`` of the ``ExportedProgram``).

    Args:
        opset_version: Target opset; ``None`` takes the newest the installed onnxscript supports.
        optimize: Run the onnxscript optimiser (constant folding, dead-code elimination, ...).
        ort_fusions: Fuse into ONNX Runtime contrib ops for ``"cpu"``, ``"cuda"``, ``"webgpu"`` or ``"dml"``;
            needs ``optimize=True``.
    """

    export_format: ExportFormat = ExportFormat.ONNX
    opset_version: int | None = None
    optimize: bool = True
    ort_fusions: str | None = None

    _checks: ClassVar = {
        "opset_version": ((int, type(None)), None),
        "optimize": ((bool,), None),
        "ort_fusions": ((str, type(None)), (*_ORT_FUSIONS, None)),
    }

    def _problems(self) -> list[str]:
        problems = super()._problems()
        if isinstance(self.opset_version, int) and not isinstance(self.opset_version, bool) and self.opset_version < 18:
            problems.append(f"opset_version: {self.opset_version} is too old; the dynamo exporter needs >= 18")
        if self.ort_fusions is not None and self.optimize is False:
            problems.append("ort_fusions: needs optimize=True (the fusions run inside the optimiser)")
        return problems


_ET_BACKENDS = ("xnnpack", "cuda", "mlx")


@dataclasses.dataclass
class ExecutorchConfig(DynamoConfig):
    """Configuration for exporting to an ExecuTorch program (``.pte``).

    Args:
        backend: ``"xnnpack"`` (CPU, default), ``"cuda"`` or ``"mlx"`` (Apple Silicon).
        alloc_graph_input: Memory-plan graph inputs into the arena; ``False`` uses the caller's buffers.
        alloc_graph_output: Memory-plan graph outputs; ``False`` makes the caller bind output buffers.
        alloc_mutable_buffers: Memory-plan mutable buffers.
    """

    export_format: ExportFormat = ExportFormat.EXECUTORCH
    backend: str = "xnnpack"
    alloc_graph_input: bool = True
    alloc_graph_output: bool = True
    alloc_mutable_buffers: bool = True

    _checks: ClassVar = {
        "backend": ((str,), _ET_BACKENDS),
        "alloc_graph_input": ((bool,), None),
        "alloc_graph_output": ((bool,), None),
        "alloc_mutable_buffers": ((bool,), None),
    }


@dataclasses.dataclass
class OpenVINOConfig(DynamoConfig):
    """Configuration for exporting to OpenVINO IR (``openvino.convert_model`` of the ``ExportedProgram``).

    Args:
        compress_to_fp16: Store float32 weights as float16.
        stateful: Fold round-tripped state (KV cache, SSM states) into OpenVINO variables with a ``beam_idx`` input.
    """

    export_format: ExportFormat = ExportFormat.OPENVINO
    compress_to_fp16: bool = False
    stateful: bool = True

    _checks: ClassVar = {
        "compress_to_fp16": ((bool,), None),
        "stateful": ((bool,), None),
    }


@dataclasses.dataclass
class AotiConfig(DynamoConfig):
    """Configuration for compiling the ``torch.export`` graph ahead of time with AOTInductor (a ``.pt2`` package).

    The package holds machine code built for this machine's CPU (``-march=native``) and this torch: it loads only
    where both match (the loader says which feature or version differs), and only with ``trust_remote_code=True``.

    Args:
        gemm: How the linears run. ``"cpp"``: Inductor's C++ GEMM micro-kernels, autotuned against torch's ``mm`` at
            compile time, on weights frozen and prepacked into the package (``freezing``, ``max_autotune``); each
            package then carries its packed weights and (torch 2.13's AOTInductor) the original ones as unused
            constants: 2x the weights per package. ``"aten"``: torch's own ``mm`` (MKL) at run time, the weights
            kept out of the library and stored once for the folder. ``"auto"`` (default): ``"cpp"`` for the decode
            graph, whose GEMMs are a few rows (SmolLM2-135M decodes at 48.8 tok/s against 19.4 with ``"aten"``,
            eager 14-16), ``"aten"`` for graphs over a whole prompt (prefill, encoder, a plain ``export``), where
            MKL's GEMM is faster than the micro-kernels autotuned at the sample's few tokens (a 512-token prefill
            took 2.1 s with ``"cpp"`` against 1.0 s eager) and sums in the same order as eager.
        inductor_configs: Inductor options for the compile (``{"cpp.simdlen": 256}``), applied over what ``gemm``
            sets, passed to ``torch._inductor.aoti_compile_and_package``; JSON values only (the export records them).

    Example:
        >>> AotiConfig(dynamic=True).to_dict()["export_format"]
        'aoti'
    """

    export_format: ExportFormat = ExportFormat.AOTI
    gemm: str = "auto"
    inductor_configs: dict[str, Any] | None = None

    _checks: ClassVar = {"gemm": ((str,), ("auto", "cpp", "aten")), "inductor_configs": ((dict, type(None)), None)}

    def _problems(self) -> list[str]:
        problems = super()._problems()
        if isinstance(self.inductor_configs, dict):
            for key, value in self.inductor_configs.items():
                if not isinstance(key, str):
                    problems.append(f"inductor_configs: keys are Inductor option names (str), got {key!r}")
                elif key.startswith("aot_inductor.package"):
                    problems.append(f"inductor_configs: {key!r} is set by the exporter (where the weights go follows "
                                    "gemm=)")
                try:
                    json.dumps(value)
                except TypeError:
                    problems.append(f"inductor_configs[{key!r}]: {type(value).__name__} is not a JSON value")
        return problems


BUILTIN_CONFIGS: dict[ExportFormat, type[ExportConfigMixin]] = {
    ExportFormat.DYNAMO: DynamoConfig,
    ExportFormat.ONNX: OnnxConfig,
    ExportFormat.EXECUTORCH: ExecutorchConfig,
    ExportFormat.OPENVINO: OpenVINOConfig,
    ExportFormat.AOTI: AotiConfig,
}
