"""What an exporter records about one graph: the spec's ``ExportMetadata`` plus a typed I/O signature.

The signature carries the role of every flat input and output as data (user input, cache input, cache output,
mutation of an input, backend state), so runners never parse names to know what a tensor is. Tree specs are stored
as ``treespec_dumps`` JSON strings; nothing here is pickled.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
from collections.abc import Mapping
from typing import Any

import torch
import torch.utils._pytree as pytree

from .derived import DerivedInput
from .pytrees import is_cache, load_spec

__all__ = ["ExportMetadata", "IORole", "TensorSpec", "KwargKind", "KwargSpec", "LeafRole", "CacheLeaf"]


class IORole(str, enum.Enum):
    """Role of one flat input or output of an exported graph."""

    INPUT = "input"
    CACHE_INPUT = "cache_input"
    OUTPUT = "output"
    CACHE_OUTPUT = "cache_output"
    MUTATION = "mutation"  # the new value of an input the graph updates in place (USER_INPUT_MUTATION)
    STATE = "state"  # kept inside the backend between calls (e.g. OpenVINO variables)
    CHECK = "check"  # a boolean the runner checks after the call: an assumption of the trace (capture.assumptions)

    def __str__(self) -> str:
        return self.value


#: :meth:`ExportMetadata.cache_leaves`' default: leaves of every part of the cache
ANY_PART: Any = type("AnyPart", (), {"__repr__": lambda self: "ANY_PART"})()


class KwargKind(str, enum.Enum):
    """What one traced forward kwarg was."""

    TENSOR = "tensor"
    CACHE = "cache"  # a transformers Cache (its leaves are cache inputs)
    CONSTANT = "constant"  # an int, float, bool, string or None, specialised into the graph
    PYTREE = "pytree"  # another container of tensors (a dict of masks, a ModelOutput)
    FLAG = "flag"  # an output flag (use_cache, return_dict, ...) applied to the config while tracing, not traced

    def __str__(self) -> str:
        return self.value


class KwargSpec(dict):
    """One traced kwarg's description: a ``dict`` as the spec's ``ExportMetadata.kwargs`` holds and saves
    (``{"kind": "cache", "type": "StaticCache"}``), read through typed properties.

    Example:
        >>> KwargSpec.of(torch.ones(2, 3, dtype=torch.long)).kind, KwargSpec.of(torch.ones(2, 3)).ndim
        (<KwargKind.TENSOR: 'tensor'>, 2)
    """

    @classmethod
    def of(cls, value: Any) -> KwargSpec:
        """Describe a sample value of a kwarg."""
        if isinstance(value, torch.Tensor):
            return cls(kind="tensor", dtype=str(value.dtype).removeprefix("torch."), ndim=value.dim())
        if is_cache(value):
            return cls(kind="cache", type=type(value).__name__)
        if value is None or isinstance(value, bool | int | float | str):
            return cls(kind="constant")
        return cls(kind="pytree", type=type(value).__name__)

    @classmethod
    def flag(cls) -> KwargSpec:
        return cls(kind="flag")

    @property
    def kind(self) -> KwargKind:
        return KwargKind(self["kind"])

    @property
    def type_name(self) -> str | None:
        """The class name of a cache or pytree kwarg (``StaticCache``)."""
        return self.get("type")

    @property
    def ndim(self) -> int | None:
        return self.get("ndim")

    @property
    def traced(self) -> bool:
        """Whether the graph takes it (a flag only configured the trace)."""
        return self.kind is not KwargKind.FLAG

    @property
    def fed(self) -> bool:
        """Whether a caller feeds it at run time (a constant was specialised into the graph)."""
        return self.kind not in (KwargKind.FLAG, KwargKind.CONSTANT)

    @property
    def state_layout(self) -> str | None:
        """A cache kept by the program in another layout than the caller's (ExecuTorch's ``"bshd"``)."""
        return self.get("state_layout")

    @state_layout.setter
    def state_layout(self, layout: str) -> None:
        self["state_layout"] = layout

    @classmethod
    def from_dict(cls, name: str, values: Any) -> KwargSpec:
        _expect(isinstance(values, Mapping), f"kwargs.{name}", values, "an object")
        kind = values.get("kind")
        _expect(kind in _KINDS, f"kwargs.{name}.kind", kind, f"one of {sorted(_KINDS)}")
        for key in ("type", "dtype", "state_layout"):
            _expect(values.get(key) is None or isinstance(values.get(key), str), f"kwargs.{name}.{key}",
                    values.get(key), "a string")
        ndim = values.get("ndim")
        _expect(ndim is None or type(ndim) is int, f"kwargs.{name}.ndim", ndim, "an int")
        return cls(values)


class LeafRole(str, enum.Enum):
    """What one tensor of a cache holds, as the cache layer's class defines it."""

    KEYS = "keys"
    VALUES = "values"
    COUNTER = "counter"  # a layer's write position (StaticLayer.cumulative_length): a scalar, no batch axis
    RECURRENT = "recurrent"  # a linear-attention / SSM layer's state (conv or recurrent states)
    OTHER = "other"

    def __str__(self) -> str:
        return self.value


@dataclasses.dataclass
class CacheLeaf:
    """Where one tensor of a cache input sits in the cache, written at trace time from the cache object itself.

    Attributes:
        kwarg: The cache's kwarg (``past_key_values``).
        role: What the tensor holds.
        layer: The index of its layer in the cache's ``layers`` (None outside a layer).
        layer_type: Its layer's class name (``StaticSlidingWindowLayer``).
        static: Its layer keeps fixed-size buffers (a ``StaticLayer``): the sizes are the cache's capacity.
        part: The sub-cache that holds it (an ``EncoderDecoderCache``'s ``self_attention_cache`` or
            ``cross_attention_cache``); None for a cache of one part.
    """

    kwarg: str
    role: LeafRole
    layer: int | None = None
    layer_type: str | None = None
    static: bool = False
    part: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kwarg": self.kwarg, "role": str(self.role)}
        for key in ("layer", "layer_type", "part"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.static:
            out["static"] = True
        return out

    @classmethod
    def from_dict(cls, where: str, values: Any) -> CacheLeaf:
        _expect(isinstance(values, Mapping), where, values, "an object")
        _expect(isinstance(values.get("kwarg"), str), f"{where}.kwarg", values.get("kwarg"), "a string")
        role = values.get("role")
        _expect(role in _LEAF_ROLES, f"{where}.role", role, f"one of {sorted(_LEAF_ROLES)}")
        layer = values.get("layer")
        _expect(layer is None or (type(layer) is int and layer >= 0), f"{where}.layer", layer, "an index")
        for key in ("layer_type", "part"):
            _expect(values.get(key) is None or isinstance(values.get(key), str), f"{where}.{key}", values.get(key),
                    "a string")
        return cls(kwarg=values["kwarg"], role=LeafRole(role), layer=layer, layer_type=values.get("layer_type"),
                   static=values.get("static", False) is True, part=values.get("part"))


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
        cache: For a cache's tensors (``CACHE_INPUT``, and the ``STATE`` / ``CACHE_OUTPUT`` a backend derives from
            them): where in the cache it sits and what it holds.
    """

    name: str
    role: IORole
    dtype: str
    shape: list[int | str]
    mutated: bool = False
    target: str | None = None
    example_shape: list[int] | None = None
    device: str | None = None
    cache: CacheLeaf | None = None

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
        if self.cache is not None:
            out["cache"] = self.cache.to_dict()
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
            cache=None if values.get("cache") is None else CacheLeaf.from_dict(f"{name}.cache", values["cache"]),
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
    kwargs: dict[str, KwargSpec] = dataclasses.field(default_factory=dict)
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
    #: the machine a compiled program's code was built for (AOTInductor: CPU features, compiler, torch), which its
    #: loader checks before loading the code; empty for the other formats
    compiled_for: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: ``symbol -> [lower, upper]`` of the inputs' symbolic sizes (``upper`` None: unbounded), as tracing left them
    #: (a model's branch on a length can bound it: ``s0 <= 6``)
    dim_ranges: dict[str, list] = dataclasses.field(default_factory=dict)
    #: traced inputs the model derives from another input in Python (a vision tower's packed offsets from its
    #: grid), computed again from the caller's input at run time (:mod:`hfexport.derived`)
    derived_inputs: list[DerivedInput] = dataclasses.field(default_factory=list)
    #: what the trace assumed of the inputs' values (``Ne(u0, 1)``), one per :attr:`IORole.CHECK` output, in order
    assumptions: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["inputs"] = [s.to_dict() for s in self.inputs]
        out["outputs"] = [s.to_dict() for s in self.outputs]
        out["derived_inputs"] = [d.to_dict() for d in self.derived_inputs]
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
        kwargs["kwargs"] = {key: KwargSpec.from_dict(key, value) for key, value in kwargs.get("kwargs", {}).items()}
        for key in ("in_spec", "out_spec"):
            if kwargs.get(key) is not None:
                _expect(_is_json(kwargs[key]), key, kwargs[key], "a serialized tree spec (JSON text)")
        kwargs["inputs"] = [TensorSpec.from_dict(s) for s in kwargs.get("inputs", [])]
        kwargs["outputs"] = [TensorSpec.from_dict(s) for s in kwargs.get("outputs", [])]
        derived = kwargs.get("derived_inputs", [])
        _expect(all(isinstance(d, Mapping) for d in derived), "derived_inputs", derived, "a list of objects")
        kwargs["derived_inputs"] = [DerivedInput.from_dict(d) for d in derived]
        texts = kwargs.get("assumptions", [])
        _expect(all(isinstance(t, str) for t in texts), "assumptions", texts, "a list of strings")
        return cls(**kwargs)

    # --- derived views, used by the runners -------------------------------------------------------------------

    @property
    def user_outputs(self) -> list[TensorSpec]:
        return [s for s in self.outputs if s.role in (IORole.OUTPUT, IORole.CACHE_OUTPUT)]

    @property
    def checks(self) -> list[TensorSpec]:
        """The boolean outputs that check :attr:`assumptions` (after every other output)."""
        return [s for s in self.outputs if s.role is IORole.CHECK]

    @property
    def mutations(self) -> list[TensorSpec]:
        return [s for s in self.outputs if s.role is IORole.MUTATION]

    def __post_init__(self) -> None:
        self.kwargs = {k: v if isinstance(v, KwargSpec) else KwargSpec(v) for k, v in self.kwargs.items()}

    def input_spec(self, *names: str) -> TensorSpec | None:
        """The first flat input named one of ``names`` (``"input_ids"``), or None."""
        return next((s for s in self.inputs if s.name in names), None)

    def query_axis(self, names: tuple[str, ...] = ("input_ids", "decoder_input_ids")) -> int | str | None:
        """The query (sequence) axis of the graph's 2-D token ids named one of ``names``: its size where tracing
        fixed it, its symbol's name where it stayed dynamic (the graph takes several tokens a call), None without
        such an input."""
        ids = self.input_spec(*names)
        return ids.shape[1] if ids is not None and len(ids.shape) == 2 else None

    def query_limit(self, names: tuple[str, ...] = ("input_ids",)) -> int | None:
        """The most tokens one call takes on the query axis: its size where tracing fixed it, its symbol's upper
        bound where tracing bounded it, None when unbounded (or without token ids)."""
        axis = self.query_axis(names)
        if isinstance(axis, str):
            return (self.dim_ranges.get(axis) or [None, None])[1]
        return axis

    def takes_prompt(self, prefill_inputs: Mapping[str, Any]) -> bool:
        """Whether this (decode) graph can take a whole prompt: its query axis is symbolic and it takes every tensor
        the prefill call passes."""
        if not isinstance(self.query_axis(("input_ids",)), str):
            return False  # the query axis was fixed at trace time
        return {k for k, v in prefill_inputs.items() if hasattr(v, "shape")} <= set(self.kwargs)

    @property
    def returns_cache(self) -> bool:
        """Whether the graph hands a cache on: returns one, updates it in place, or keeps it as its state (an
        input kept inside the program: ExecuTorch's folded cache, OpenVINO's variables)."""
        return (any(s.role in (IORole.CACHE_OUTPUT, IORole.MUTATION, IORole.STATE) for s in self.outputs)
                or any(s.role is IORole.STATE for s in self.inputs))

    @property
    def cache_kwarg(self) -> str | None:
        """The kwarg that takes the cache (``past_key_values``), or None for a graph without one."""
        return next((k for k, v in self.kwargs.items() if v.kind is KwargKind.CACHE), None)

    @property
    def cache_type(self) -> str | None:
        """The traced cache's class name (``StaticCache``, ``EncoderDecoderCache``), or None."""
        key = self.cache_kwarg
        return self.kwargs[key].type_name if key is not None else None

    def kind_of(self, kwarg: str) -> KwargKind | None:
        """How ``kwarg`` was traced, or None when the graph was not traced with it."""
        spec = self.kwargs.get(kwarg)
        return spec.kind if spec is not None else None

    def cache_leaves(self, role: LeafRole | None = None, part: Any = ANY_PART,
                     static: bool | None = None) -> list[TensorSpec]:
        """The cache's input tensors, in the program's order; filtered by what they hold, the sub-cache they sit in
        (``part=None``: a cache of one part) and whether their layer is static."""
        return [
            s for s in self.inputs
            if s.cache is not None and (role is None or s.cache.role is role)
            and (part is ANY_PART or s.cache.part == part) and (static is None or s.cache.static is static)
        ]

    def kwarg_specs(self) -> dict[str, pytree.TreeSpec]:
        """Each traced kwarg's pytree spec, by name, from ``in_spec`` (a kwargs dict spec, or torch.export's
        ``(args, kwargs)`` pair)."""
        if not self.in_spec:
            return {}
        return dict(_kwarg_specs(self.in_spec))


@functools.lru_cache(maxsize=256)
def _kwarg_specs(in_spec: str) -> tuple[tuple[str, pytree.TreeSpec], ...]:
    """Parsed once per spec text: the generation loop asks at every step (which mask keys, which cache), and
    loading a spec walks and registers the cache classes it names (~0.2 ms a step on a tiny model, measured)."""
    spec = load_spec(in_spec)
    kwargs_spec = spec.child(1) if spec.type is tuple and spec.num_children == 2 else spec
    names = list(kwargs_spec.context) if kwargs_spec.type is dict else []
    return tuple((name, kwargs_spec.child(i)) for i, name in enumerate(names))


# --- checking saved metadata -------------------------------------------------------------------------------------

_ROLES = {role.value for role in IORole}
_KINDS = {kind.value for kind in KwargKind}
_LEAF_ROLES = {role.value for role in LeafRole}
_DTYPE_NAMES = {str(d).removeprefix("torch.") for d in vars(torch).values() if isinstance(d, torch.dtype)}
_OPTIONAL_STR = ((str, type(None)), "a string or null")
_FIELD_TYPES: dict[str, tuple[Any, str]] = {
    "architecture": _OPTIONAL_STR, "export_dtype": _OPTIONAL_STR, "export_device": _OPTIONAL_STR,
    "in_spec": _OPTIONAL_STR, "out_spec": _OPTIONAL_STR,
    "packages": (dict, "an object"), "export_config": (dict, "an object"), "kwargs": (dict, "an object"),
    "in_constants": (dict, "an object"), "out_constants": (list, "a list"), "inputs": (list, "a list"),
    "outputs": (list, "a list"), "workarounds": (list, "a list"), "program_constants": (list, "a list"),
    "compiled_for": (dict, "an object"), "dim_ranges": (dict, "an object"), "derived_inputs": (list, "a list"),
    "assumptions": (list, "a list"),
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


def json_constant(value: Any) -> Any:
    """A JSON-able form of a non-tensor leaf (ints, floats, bools, strings, None, dtypes)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.dtype):
        return str(value)
    return repr(value)


def shape_of(value: Any) -> list[int | str]:
    """Sizes of a (fake) tensor: ints for static sizes (specialised symbols included), symbol names otherwise."""
    out: list[int | str] = []
    for d in value.shape:
        text = str(d)
        out.append(int(text) if isinstance(d, int) or text.lstrip("-").isdigit() else text)
    return out
