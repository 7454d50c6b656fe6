"""transformers' caches as pytree nodes: a cache flattens to its tensors, each under a readable key path
(``layers.0.keys``), and a context that is plain JSON (the class path and every non-tensor attribute), so that tree
specs serialise with ``treespec_dumps`` and reload with no pickle, and unflattening rebuilds the exact class without
the model config. Only classes from ``transformers`` (and this package) are ever rebuilt from a context.
"""

from __future__ import annotations

import importlib
import inspect
import threading
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = [
    "cache_leaf_owners",
    "register_pytree_node",
    "register_cache_classes",
    "ensure_registered",
    "cache_class_paths",
    "context_slot_names",
    "serialization_safe_classes",
    "is_cache",
]

_ALLOWED_MODULE_PREFIXES = ("transformers.", "hfexport.")
_lock = threading.Lock()
_registered: set[type] = set()
_ours: set[type] = set()  # registered here, with this module's flatten (not by transformers or a user)
_safe: set[type] = set()


def _is_ours(cls: type) -> bool:
    return _class_path(cls).startswith(_ALLOWED_MODULE_PREFIXES)


def _class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _class_from_path(path: str) -> type:
    if not path.startswith(_ALLOWED_MODULE_PREFIXES):
        raise TypeError(f"refusing to rebuild {path!r}: only transformers/hfexport classes are allowed in a tree spec")
    module_name, _, qualname = path.rpartition(".")
    while module_name:
        try:
            obj: Any = importlib.import_module(module_name)
            break
        except ModuleNotFoundError:
            module_name, _, head = module_name.rpartition(".")
            qualname = f"{head}.{qualname}"
    else:
        raise TypeError(f"cannot import the module of {path!r}")
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# --- object <-> (tensors, JSON context) --------------------------------------------------------------------------
# Tags: {"t": i} tensor slot i; {"dtype": "float32"}; {"device": "cpu"}; {"obj": path, "attrs": {...}};
# {"list": [...]}; {"tuple": [...]}; {"dict": [[key, value], ...]} (keys may be ints); plain JSON scalars as is.


def join_name(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _encode(value: Any, tensors: list, keys: list, path: str) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        keys.append(path)
        return {"t": len(tensors) - 1}
    if isinstance(value, torch.SymInt):
        # a size that depends on the traced shapes (e.g. a sliding layer's cumulative length): it cannot live in
        # the static context, so it travels as a 0-d tensor leaf and comes back as an int at run time
        tensors.append(torch.scalar_tensor(value, dtype=torch.long))
        keys.append(path)
        return {"int": len(tensors) - 1}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.device):
        return {"device": str(value)}
    if isinstance(value, list | tuple):
        tag = "list" if isinstance(value, list) else "tuple"
        return {tag: [_encode(v, tensors, keys, join_name(path, i)) for i, v in enumerate(value)]}
    if isinstance(value, dict):
        return {"dict": [[k, _encode(v, tensors, keys, join_name(path, k))] for k, v in value.items()]}
    if inspect.isclass(value) and _class_path(value).startswith(_ALLOWED_MODULE_PREFIXES):
        return {"cls": _class_path(value)}
    if hasattr(value, "__dict__") and _class_path(type(value)).startswith(_ALLOWED_MODULE_PREFIXES):
        attrs = {
            name: _encode(v, tensors, keys, join_name(path, name))
            for name, v in vars(value).items()
            if not callable(v) or inspect.isclass(v)
        }
        return {"obj": _class_path(type(value)), "attrs": attrs}
    raise TypeError(f"cannot carry a {type(value).__name__} inside a cache through export")


def _decode(ctx: Any, tensors: list) -> Any:
    if ctx is None or isinstance(ctx, bool | int | float | str):
        return ctx
    if "t" in ctx:
        return tensors[ctx["t"]]
    if "int" in ctx:
        value = tensors[ctx["int"]]
        return int(value) if _is_concrete(value) else value
    if "dtype" in ctx:
        return getattr(torch, ctx["dtype"])
    if "device" in ctx:
        return torch.device(ctx["device"])
    if "list" in ctx:
        return [_decode(v, tensors) for v in ctx["list"]]
    if "tuple" in ctx:
        return tuple(_decode(v, tensors) for v in ctx["tuple"])
    if "dict" in ctx:
        return {k: _decode(v, tensors) for k, v in ctx["dict"]}
    if "cls" in ctx:
        return _class_from_path(ctx["cls"])
    if "obj" in ctx:
        cls = _class_from_path(ctx["obj"])
        instance = cls.__new__(cls)
        for name, v in ctx["attrs"].items():
            instance.__dict__[name] = _decode(v, tensors)
        return instance
    raise TypeError(f"unknown cache context entry {ctx!r}")


def _is_concrete(value: Any) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    # FunctionalTensor: a re-trace of the program (run_decompositions, torch.onnx.export) unflattens outputs too
    return isinstance(value, torch.Tensor) and not isinstance(value, FakeTensor | FunctionalTensor) and not isinstance(
        value, torch.fx.Proxy
    ) and value.numel() == 1


def _flatten_with_keys(obj: Any) -> tuple[list[tuple[Any, torch.Tensor]], Any]:
    tensors: list = []
    keys: list = []
    attrs = {
        name: _encode(v, tensors, keys, name)
        for name, v in vars(obj).items()
        if not callable(v) or inspect.isclass(v)
    }
    context = {"obj": _class_path(type(obj)), "attrs": attrs}
    # one key per child; torch.export only accepts the standard key kinds, so the nested attribute path is
    # carried as a single dotted MappingKey ("layers.0.keys"), used for naming only
    return [(pytree.MappingKey(k), t) for k, t in zip(keys, tensors)], context


def cache_tensors(obj: Any) -> list[torch.Tensor]:
    """The tensors a cache flattens to (:func:`_flatten_with_keys`, the same walk), in the same order, without
    building the context: the fast path of :func:`tensor_leaves`, for runners that flatten a cache at every step."""
    out: list[torch.Tensor] = []

    def collect(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, torch.SymInt):
            out.append(torch.scalar_tensor(value, dtype=torch.long))
        elif isinstance(value, list | tuple):
            for v in value:
                collect(v)
        elif isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif (
            value is not None
            and not isinstance(value, bool | int | float | str | torch.dtype | torch.device)
            and not inspect.isclass(value)
            and hasattr(value, "__dict__")
        ):
            for v in vars(value).values():
                if not callable(v) or inspect.isclass(v):
                    collect(v)

    collect(obj)
    return out


def cache_leaf_owners(obj: Any) -> list[tuple[tuple[Any, ...], tuple[tuple[tuple[Any, ...], Any], ...]]]:
    """For each tensor a cache flattens to (the order of :func:`_flatten_with_keys`): its path of attribute names,
    indices and keys from the cache, and the objects along that path as ``(path to it, object)`` (the cache first,
    the tensor's holder last). What the signature reads, at trace time, to say where in the cache each leaf sits
    (its layer, its sub-cache)."""
    out: list[tuple[tuple[Any, ...], tuple[tuple[tuple[Any, ...], Any], ...]]] = []

    def visit(value: Any, path: tuple[Any, ...], owners: tuple[tuple[tuple[Any, ...], Any], ...]) -> None:
        if isinstance(value, torch.Tensor | torch.SymInt):
            out.append((path, owners))
        elif isinstance(value, list | tuple):
            for i, v in enumerate(value):
                visit(v, (*path, i), owners)
        elif isinstance(value, dict):
            for k, v in value.items():
                visit(v, (*path, k), owners)
        elif (
            value is not None
            and not isinstance(value, bool | int | float | str | torch.dtype | torch.device)
            and not inspect.isclass(value)
            and hasattr(value, "__dict__")
        ):
            for name, v in vars(value).items():
                if not callable(v) or inspect.isclass(v):
                    visit(v, (*path, name), (*owners, (path, value)))

    visit(obj, (), ())
    return out


def _flatten(obj: Any) -> tuple[list[torch.Tensor], Any]:
    pairs, context = _flatten_with_keys(obj)
    return [t for _, t in pairs], context


def _unflatten(values: Any, context: Any) -> Any:
    return _decode(context, list(values))


def context_slot_names(context: Any) -> list[str]:
    """Dotted names of a cache context's tensor slots, in slot order (``layers.0.keys``, ...)."""
    names: dict[int, str] = {}

    def walk(ctx: Any, prefix: str) -> None:
        if not isinstance(ctx, dict):
            return
        for tag in ("t", "int"):
            if tag in ctx and isinstance(ctx[tag], int):
                names[ctx[tag]] = prefix
                return
        if "attrs" in ctx:
            for name, value in ctx["attrs"].items():
                walk(value, f"{prefix}.{name}" if prefix else name)
        for tag in ("list", "tuple"):
            for i, value in enumerate(ctx.get(tag, [])):
                walk(value, f"{prefix}.{i}" if prefix else str(i))
        for key, value in ctx.get("dict", []):
            walk(value, f"{prefix}.{key}" if prefix else str(key))

    walk(context, "")
    return [names[i] for i in range(len(names))]


def register_pytree_node(object_cls: type) -> None:
    """Register one class (e.g. ``StaticCache``) as a pytree node, so ``torch.export`` can take and return it.

    Idempotent. ``torch.export.load`` of a program whose inputs include the class needs it registered first; this
    also registers transformers' output classes and lets ``torch.load(weights_only=True)`` rebuild cache objects
    (a saved program's sample inputs), so loading never needs a full unpickle.

    Example:
        >>> from transformers import StaticCache
        >>> register_pytree_node(StaticCache)
    """
    import transformers.modeling_outputs  # noqa: F401  (output classes register with pytree on import)

    with _lock:
        new = [c for c in (*serialization_safe_classes(), object_cls) if c not in _safe and _is_ours(c)]
        if new:
            torch.serialization.add_safe_globals(new)
            _safe.update(new)
        if object_cls in _registered or object_cls in pytree.SUPPORTED_NODES:
            _registered.add(object_cls)
            return
        pytree.register_pytree_node(
            object_cls,
            _flatten,
            _unflatten,
            serialized_type_name=_class_path(object_cls),
            flatten_with_keys_fn=_flatten_with_keys,
        )
        _registered.add(object_cls)
        _ours.add(object_cls)


def serialization_safe_classes() -> list[type]:
    """Classes a saved program's sample inputs may hold: transformers caches, cache layers and model outputs."""
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.utils.generic import ModelOutput

    classes = [Cache, *_subclasses(Cache), *_subclasses(CacheLayerMixin), *_subclasses(ModelOutput)]
    return list(dict.fromkeys(c for c in classes if c.__module__.startswith("transformers.")))


def _subclasses(cls: type) -> list[type]:
    out = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_subclasses(sub))
    return out


def is_cache(value: Any) -> bool:
    """Whether ``value`` is a transformers cache object (a ``Cache`` or a model-specific ``*Cache`` class)."""
    from transformers.cache_utils import Cache

    cls = value if isinstance(value, type) else type(value)
    return issubclass(cls, Cache) or (cls.__name__.endswith("Cache") and cls.__module__.startswith("transformers."))


def register_cache_classes(model: torch.nn.Module | None = None) -> None:
    """Register every ``Cache`` subclass known now, plus the cache classes defined in ``model``'s modeling module."""
    from transformers.cache_utils import Cache

    for cls in _subclasses(Cache):
        register_pytree_node(cls)
    if model is not None:
        module = inspect.getmodule(type(model))
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if obj.__module__ == type(model).__module__ and is_cache(obj):
                register_pytree_node(obj)


def cache_class_paths(serialized_spec: Any) -> list[str]:
    """Class paths named in a serialized tree spec (JSON data), to import and register before loading it."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "type" and isinstance(value, str) and "." in value:
                    found.append(value)
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(serialized_spec)
    return found


def ensure_registered(type_paths: list[str]) -> None:
    """Import (from allowed modules only) and register the cache classes a saved spec names."""
    for path in type_paths:
        if not path.startswith(_ALLOWED_MODULE_PREFIXES):
            continue
        try:
            cls = _class_from_path(path)
        except (TypeError, AttributeError, ImportError):
            continue
        if isinstance(cls, type) and is_cache(cls):
            register_pytree_node(cls)


# --- leaf names and the walkers over them -------------------------------------------------------------------------


def reads_as_cache(value: Any) -> bool:
    """Whether :func:`tensor_leaves` reads ``value`` through :func:`cache_tensors`: a cache this module registered
    (the same tensors as its pytree flatten), or one nobody registered yet (read the way it will flatten)."""
    cls = type(value)
    if cls in _ours:
        return True
    return cls not in pytree.SUPPORTED_NODES and not isinstance(value, torch.Tensor) and is_cache(value)
