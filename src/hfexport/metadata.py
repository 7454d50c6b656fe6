"""What an exporter records about one graph: the spec's ``ExportMetadata`` plus a typed I/O signature.

The signature carries the role of every flat input and output as data (user input, cache input, cache output,
mutation of an input, backend state), so runners never parse names to know what a tensor is. Tree specs are stored
as ``treespec_dumps`` JSON strings; nothing here is pickled.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from .capture.caches import cache_class_paths, ensure_registered, is_cache

__all__ = ["ExportMetadata", "IORole", "TensorSpec", "leaf_name", "flatten_with_names", "load_spec", "dump_spec"]


class IORole(str, enum.Enum):
    """Role of one flat input or output of an exported graph."""

    INPUT = "input"
    CACHE_INPUT = "cache_input"
    OUTPUT = "output"
    CACHE_OUTPUT = "cache_output"
    MUTATION = "mutation"  # the new value of an input the graph updates in place (USER_INPUT_MUTATION)
    STATE = "state"  # kept inside the backend between calls (e.g. OpenVINO variables)

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass
class TensorSpec:
    """One flat tensor of a graph's signature.

    Attributes:
        name: Dotted pytree path, unique within the signature: ``input_ids``, ``past_key_values.layers.0.keys``.
        role: What the tensor is for.
        dtype: Torch dtype name (``float32``).
        shape: Sizes; a symbolic size is its symbol's name (``s0``).
        mutated: For inputs: the graph writes the new value back into this input.
        target: For ``MUTATION``/``STATE`` outputs: the name of the input whose new value this is.
        example_shape: For inputs: the concrete shape of the sample the graph was traced with.
        device: For inputs traced on another device than the model's weights (a static cache's write counter kept
            on the CPU beside GPU keys and values): that device; ``None`` where it is the weights' device.
    """

    name: str
    role: IORole
    dtype: str
    shape: list[int | str]
    mutated: bool = False
    target: str | None = None
    example_shape: list[int] | None = None
    device: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out = {"name": self.name, "role": str(self.role), "dtype": self.dtype, "shape": list(self.shape)}
        if self.mutated:
            out["mutated"] = True
        if self.target is not None:
            out["target"] = self.target
        if self.example_shape is not None:
            out["example_shape"] = list(self.example_shape)
        if self.device is not None:
            out["device"] = self.device
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> TensorSpec:
        """Build from a saved dict; a field of the wrong type is a ``ValueError`` naming it."""
        if not isinstance(values, Mapping):
            raise ValueError(f"a tensor spec must be an object, got {type(values).__name__}")
        name = values.get("name")
        _expect(isinstance(name, str), "name", name, "a string")
        role = values.get("role")
        _expect(role in _ROLES, f"{name}.role", role, f"one of {sorted(_ROLES)}")
        dtype = values.get("dtype")
        _expect(dtype in _DTYPE_NAMES, f"{name}.dtype", dtype, "a torch dtype name")
        shape = values.get("shape")
        _expect(_sizes(shape, symbols=True), f"{name}.shape", shape, "a list of sizes (ints or symbol names)")
        example = values.get("example_shape")
        _expect(example is None or _sizes(example, symbols=False), f"{name}.example_shape", example, "a list of ints")
        for key in ("target", "device"):
            _expect(values.get(key) is None or isinstance(values.get(key), str), f"{name}.{key}", values.get(key),
                    "a string")
        return cls(
            name=name,
            role=IORole(role),
            dtype=dtype,
            shape=list(shape),
            mutated=values.get("mutated", False) is True,
            target=values.get("target"),
            example_shape=example,
            device=values.get("device"),
        )


@dataclasses.dataclass
class ExportMetadata:
    """What the exporter recorded about one graph.

    The first ten fields are the spec's. ``inputs``/``outputs`` are the typed flat signature in the program's own
    order; ``workarounds`` lists the ids of the workarounds that fired while exporting this graph.
    """

    architecture: str | None = None
    packages: dict[str, str] = dataclasses.field(default_factory=dict)
    export_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    export_dtype: str | None = None
    export_device: str | None = None
    kwargs: dict[str, dict] = dataclasses.field(default_factory=dict)
    in_spec: str | None = None
    out_spec: str | None = None
    in_constants: dict[str, Any] = dataclasses.field(default_factory=dict)
    out_constants: list = dataclasses.field(default_factory=list)
    inputs: list[TensorSpec] = dataclasses.field(default_factory=list)
    outputs: list[TensorSpec] = dataclasses.field(default_factory=list)
    workarounds: list[str] = dataclasses.field(default_factory=list)
    #: ``[slot, value]`` of each input the export specialised to a constant (an int, a None) that the lowered
    #: program still takes as an input, with the value it must be fed (ExecuTorch methods keep them)
    program_constants: list[list] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["inputs"] = [s.to_dict() for s in self.inputs]
        out["outputs"] = [s.to_dict() for s in self.outputs]
        return out

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ExportMetadata:
        """Build from a saved dict, skipping keys this version does not know (written by a newer one).

        Raises:
            ValueError: a known field has the wrong type (the message names it).
        """
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in values.items() if k in names}
        for key, value in kwargs.items():
            kind, label = _FIELD_TYPES[key]
            _expect(isinstance(value, kind) and not isinstance(value, bool), key, value, label)
        for key, value in kwargs.get("kwargs", {}).items():
            _expect(isinstance(value, dict), f"kwargs.{key}", value, "an object")
        for key in ("in_spec", "out_spec"):
            if kwargs.get(key) is not None:
                _expect(_is_json(kwargs[key]), key, kwargs[key], "a serialized tree spec (JSON text)")
        kwargs["inputs"] = [TensorSpec.from_dict(s) for s in kwargs.get("inputs", [])]
        kwargs["outputs"] = [TensorSpec.from_dict(s) for s in kwargs.get("outputs", [])]
        return cls(**kwargs)

    # --- derived views, used by the runners -------------------------------------------------------------------

    @property
    def user_outputs(self) -> list[TensorSpec]:
        return [s for s in self.outputs if s.role in (IORole.OUTPUT, IORole.CACHE_OUTPUT)]

    @property
    def mutations(self) -> list[TensorSpec]:
        return [s for s in self.outputs if s.role is IORole.MUTATION]

    def kwarg_specs(self) -> dict[str, pytree.TreeSpec]:
        """Each traced kwarg's pytree spec, by name, from ``in_spec`` (a kwargs dict spec, or torch.export's
        ``(args, kwargs)`` pair)."""
        if not self.in_spec:
            return {}
        spec = load_spec(self.in_spec)
        kwargs_spec = spec.child(1) if spec.type is tuple and spec.num_children == 2 else spec
        names = list(kwargs_spec.context) if kwargs_spec.type is dict else []
        return {name: kwargs_spec.child(i) for i, name in enumerate(names)}


# --- checking saved metadata -------------------------------------------------------------------------------------

_ROLES = {role.value for role in IORole}
_DTYPE_NAMES = {str(d).removeprefix("torch.") for d in vars(torch).values() if isinstance(d, torch.dtype)}
_OPTIONAL_STR = ((str, type(None)), "a string or null")
_FIELD_TYPES: dict[str, tuple[Any, str]] = {
    "architecture": _OPTIONAL_STR, "export_dtype": _OPTIONAL_STR, "export_device": _OPTIONAL_STR,
    "in_spec": _OPTIONAL_STR, "out_spec": _OPTIONAL_STR,
    "packages": (dict, "an object"), "export_config": (dict, "an object"), "kwargs": (dict, "an object"),
    "in_constants": (dict, "an object"), "out_constants": (list, "a list"), "inputs": (list, "a list"),
    "outputs": (list, "a list"), "workarounds": (list, "a list"), "program_constants": (list, "a list"),
}


def _expect(ok: bool, field: str, value: Any, what: str) -> None:
    if not ok:
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ValueError(f"metadata field {field!r} must be {what}, got {type(value).__name__} {shown}")


def _sizes(value: Any, symbols: bool) -> bool:
    return isinstance(value, list) and all(
        (type(d) is int and d >= 0) or (symbols and isinstance(d, str)) for d in value)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


# --- naming and specs -------------------------------------------------------------------------------------------


def leaf_name(path: tuple) -> str:
    """Dotted name of a pytree key path: ``past_key_values.layers.0.keys``."""
    parts: list[str] = []
    for key in path:
        if isinstance(key, pytree.MappingKey):
            parts.append(str(key.key))
        elif isinstance(key, pytree.GetAttrKey):
            parts.append(key.name)
        elif isinstance(key, pytree.SequenceKey):
            parts.append(str(key.idx))
        else:
            parts.append(str(key).strip(".[]'\""))
    return ".".join(parts)


def flatten_with_names(tree: Any) -> tuple[list[tuple[str, Any]], pytree.TreeSpec]:
    """Flatten a pytree into ``(name, leaf)`` pairs and its spec."""
    pairs, spec = pytree.tree_flatten_with_path(tree)
    return [(leaf_name(path), leaf) for path, leaf in pairs], spec


def dump_spec(spec: pytree.TreeSpec) -> str:
    return pytree.treespec_dumps(spec)


def load_spec(text: str) -> pytree.TreeSpec:
    """Load a spec saved by :func:`dump_spec`, first registering the cache/output classes it names."""
    ensure_registered(cache_class_paths(json.loads(text)))
    return pytree.treespec_loads(text)


def json_constant(value: Any) -> Any:
    """A JSON-able form of a non-tensor leaf (ints, floats, bools, strings, None, dtypes)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.dtype):
        return str(value)
    return repr(value)


def describe_kwargs(inputs: Mapping[str, Any]) -> dict[str, dict]:
    """``ExportMetadata.kwargs``: for each traced kwarg, what kind of value it was."""
    out: dict[str, dict] = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            out[key] = {"kind": "tensor", "dtype": str(value.dtype).removeprefix("torch."), "ndim": value.dim()}
        elif is_cache(value):
            out[key] = {"kind": "cache", "type": type(value).__name__}
        elif value is None or isinstance(value, bool | int | float | str):
            out[key] = {"kind": "constant"}
        else:
            out[key] = {"kind": "pytree", "type": type(value).__name__}
    return out


def shape_of(value: Any) -> list[int | str]:
    """Sizes of a (fake) tensor: ints for static sizes (specialised symbols included), symbol names otherwise."""
    out: list[int | str] = []
    for d in value.shape:
        text = str(d)
        out.append(int(text) if isinstance(d, int) or text.lstrip("-").isdigit() else text)
    return out
