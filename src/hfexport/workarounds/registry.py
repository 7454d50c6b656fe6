"""Registered workarounds of upstream bugs: each one says what it fixes, where upstream, and when to drop it.

A workaround is applied reversibly, under one process-wide lock (patches touch shared modules), only when the
installed versions fall in its range and its ``applies`` predicate holds for the model being exported. The ids of
those that fired go into the export's metadata, and ``hfexport env --workarounds`` lists them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.metadata
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

__all__ = ["Workaround", "register_workaround", "workaround", "workarounds", "applied_workarounds", "patch_attribute",
           "ON_IMPORT"]

Undo = Callable[[], None]


@dataclasses.dataclass(frozen=True)
class Workaround:
    """One reversible fix for an upstream problem.

    Attributes:
        id: Stable identifier, e.g. ``"dynamo/gemma3-sliding-cache-int"``.
        backend: ``"all"`` or the export format it is for.
        target: What it patches (dotted path of the function/class, or a graph pass name).
        breaks: What goes wrong without it.
        upstream: Link to the upstream issue, when known.
        versions: Package name -> version specifier where the bug exists (e.g. ``{"torch": "<2.14"}``); drop the
            workaround once no tested version is in range.
        apply: Applies the fix to ``(model, inputs)`` and returns the function that undoes it.
        applies: Whether the fix is needed for this ``(model, inputs)``.
    """

    id: str
    backend: str
    target: str
    breaks: str
    apply: Callable[[Any, dict], Undo]
    upstream: str | None = None
    versions: dict[str, str] = dataclasses.field(default_factory=dict)
    applies: Callable[[Any, dict], bool] = lambda model, inputs: True

    def in_version_range(self) -> bool:
        for package, spec in self.versions.items():
            try:
                installed = Version(importlib.metadata.version(package))
            except importlib.metadata.PackageNotFoundError:
                return False
            if installed not in SpecifierSet(spec, prereleases=True):
                return False
        return True

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "backend": self.backend,
            "target": self.target,
            "breaks": self.breaks,
            "upstream": self.upstream,
            "versions": dict(self.versions),
            "active": self.in_version_range(),
        }


def patch_attribute(owner: Any, name: str, value: Any) -> Undo:
    """Set ``owner.name = value``; return the function that puts the original back (a workaround's ``apply``).

    On a class, the original is taken from the class's own ``__dict__`` (a ``staticmethod`` stays one: ``getattr``
    would give back the bare function, which the class then binds as a method), and an attribute the class only
    inherited is deleted again rather than copied onto it."""
    if isinstance(owner, type):
        if name not in vars(owner):
            getattr(owner, name)  # (an AttributeError for a name nothing defines, as below)
            setattr(owner, name, value)
            return lambda: delattr(owner, name)
        original = vars(owner)[name]
    else:
        original = getattr(owner, name)
    setattr(owner, name, value)
    return lambda: setattr(owner, name, original)


def run_after(owner: Any, name: str, then: Callable[..., Any]) -> Undo:
    """Patch the method ``owner.name`` to call ``then(result, *args, **kwargs)`` after the original has returned
    ``result`` (a workaround that mends what an upstream pass or partitioner left: ``args`` start with ``self``);
    the call still returns the original's result. Return the undo, as :func:`patch_attribute`."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        then(result, *args, **kwargs)
        return result

    return patch_attribute(owner, name, wrapper)


def undo_all(undos: list[Undo]) -> Undo:
    """One undo for several patches (a workaround patching more than one attribute): undone in reverse order."""

    def undo() -> None:
        for one in reversed(undos):
            one()

    return undo


def uses_class(model: Any, module_name: str, class_name: str) -> bool:
    """Whether ``model`` has a submodule of exactly ``module_name.class_name`` (a modeling module already imported:
    a workaround's ``applies`` for one model family's class)."""
    module = sys.modules.get(module_name)
    cls = getattr(module, class_name, None) if module is not None else None
    return cls is not None and hasattr(model, "modules") and any(type(m) is cls for m in model.modules())


@functools.lru_cache(maxsize=None)
def _module_source_names(module_name: str, text: str) -> bool:
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None)
    try:
        with open(path, encoding="utf-8") as f:
            return text in f.read()
    except (OSError, TypeError):
        return False


def modeling_code_names(model: Any, text: str) -> bool:
    """Whether the source of a module that defines one of ``model``'s submodules contains ``text`` (each module read
    once): a workaround's ``applies`` for a call the modeling code makes (``torch.distributions``,
    ``F.embedding_bag``)."""
    modules = getattr(model, "modules", None)
    return callable(modules) and any(_module_source_names(type(m).__module__, text) for m in modules())


#: The ``backend`` of the workarounds that make a package importable: an import hook applies one (through
#: :func:`applied_workarounds` with its id) when the package is first imported, never an export's scope.
ON_IMPORT = "import"

_registry: dict[str, Workaround] = {}
_apply_lock = threading.RLock()


def register_workaround(workaround: Workaround) -> Workaround:
    """Add a workaround to the registry (its id must be new)."""
    if workaround.id in _registry:
        raise ValueError(f"workaround {workaround.id!r} is already registered")
    _registry[workaround.id] = workaround
    return workaround


def register_for_backends(suffix: str, apply: Callable[[Any, dict], Undo], applies: Callable[[Any, dict], bool],
                          rows: Iterable[tuple[str, dict[str, str], str, str]]) -> None:
    """Register one rewrite as a workaround per backend, ``"<backend>-<suffix>"``, from ``(backend, versions, target,
    breaks)`` rows: each backend's own reason and tested versions (an op none of them converts)."""
    for backend, versions, target, breaks in rows:
        register_workaround(Workaround(id=f"{backend}-{suffix}", backend=backend, target=target, breaks=breaks,
                                       upstream=None, versions=versions, apply=apply, applies=applies))


def workaround(**fields: Any) -> Callable[[Callable[[Any, dict], Undo]], Callable[[Any, dict], Undo]]:
    """Register the decorated ``apply(model, inputs) -> undo`` as a :class:`Workaround` with ``fields`` (every
    field but ``apply``)::

        @workaround(id="onnx-view-as-reshape", backend="onnx", target="...", breaks="...", versions={"torch": "<2.14"})
        def _apply(model, inputs):
            return patch_attribute(module, "decompose", ...)
    """

    def register(apply: Callable[[Any, dict], Undo]) -> Callable[[Any, dict], Undo]:
        register_workaround(Workaround(apply=apply, **fields))
        return apply

    return register


def workarounds(backend: str | None = None) -> list[Workaround]:
    """The registered workarounds, all or those that apply to ``backend`` (including ``"all"``)."""
    _load_builtin()
    return [w for w in _registry.values() if backend is None or w.backend in ("all", str(backend))]


@contextlib.contextmanager
def applied_workarounds(backend: str | None, model: Any, inputs: dict,
                        ids: Iterable[str] | None = None) -> Iterator[list[str]]:
    """Apply every workaround for ``backend`` (or, with ``ids``, those workarounds whatever their backend) that
    applies to ``model``; undo them all on exit, in reverse order. The one apply loop: the trace's scope and a
    quantizer's library call both go through it.

    Yields the list of ids that fired (filled before the body runs).
    """
    wanted = None if ids is None else set(ids)
    fired: list[str] = []
    undos: list[Undo] = []
    with _apply_lock:
        try:
            # (ids all registered already: no need to import every built-in, as an import hook's call would)
            known = wanted is not None and wanted <= _registry.keys()
            candidates = list(_registry.values()) if known else workarounds(None if wanted is not None else backend)
            for w in candidates:
                if wanted is not None and w.id not in wanted:
                    continue
                if w.in_version_range() and w.applies(model, inputs):
                    undos.append(w.apply(model, inputs))
                    fired.append(w.id)
            yield fired
        finally:
            for undo in reversed(undos):
                undo()


_builtin_loaded = False

#: The built-in workarounds, one module each; importing one registers it. Dotted paths, imported on first use: the
#: modules import this registry, so the registry naming them by import would be a circle.
BUILTIN_MODULES = tuple(f"hfexport.workarounds.{name}" for name in (
    "dynamo_sdpa_gqa", "onnx_sdpa_gqa", "onnx_sdpa_heads", "onnx_view_reshape", "models.mamba",
    "moe_experts", "openvino_empty_cat", "openvino_sdpa_masked_rows", "openvino_mha_postops", "openvino_scalar_converts",
    "executorch_xnnpack_visitors", "executorch_torchao_embedding_padding",
    "onnx_dequantize_per_channel", "quantize_ort_attention", "quantize_ort_nbits_logging", "quantize_xnnpack_int_scalars",
    "openvino_index_add", "openvino_repeated_outputs", "torch_var_keyword_inputs", "executorch_lifted_constants",
    "executorch_symbolic_empty", "models.longcat_flash", "models.complex_rotary", "models.packed_vision_attention",
    "executorch_conv3d_patches", "onnx_masked_scatter",
    "onnx_full_dtype", "executorch_sort_topk", "models.placeholder_check", "models.dbrx",
    "onnx_mul_scalar", "onnx_squeeze_dims", "onnx_scalar_first", "onnx_no_op_tolerance",
    "executorch_sym_min_max", "openvino_symbolic_ints", "executorch_bucketize", "models.gemma3n",
    "executorch_transposed_views", "openvino_global_avg_pool", "openvino_sdpa_gqa", "openvino_unfold",
    "openvino_negative_floordiv", "executorch_list_return_guard", "executorch_python_sym_ops",
    "openvino_mask_fill", "models.cpmant", "onnx_index_put_mask", "openvino_sdpa_no_mask", "models.rwkv",
    "cumulative_extrema", "antialias_resize", "onnx_rewrite_initializer_names", "onnx_attention_mask_rows",
    "onnx_attention_min_mask", "onnx_integer_sum", "onnx_constant_outputs", "onnx_index_dtype",
    "openvino_constant_outputs",
    "executorch_view_bounds", "executorch_sym_mod", "torchvision_ops", "executorch_index_dtype",
    "executorch_unbacked_strides", "models.series_attention_mask", "models.precomputed_kwargs", "onnx_index_one_axis",
    "executorch_duplicate_validation", "torch_real_tensor_offsets", "scatter_reduce", "distribution_validation",
    "openvino_item_dtype", "embedding_bag", "openvino_split_to_bool", "executorch_xnnpack_repeated_outputs",
    "executorch_repeat_interleave", "openvino_integer_division",
    "models.prophetnet", "searchsorted", "openvino_symbolic_floats", "models.longformer",
    "executorch_nonzero_layout", "executorch_negative_pad", "openvino_tile_unit_dims",
    "executorch_partition_cycles", "executorch_xnnpack_idle_passes", "executorch_squeeze_symbolic",
    "executorch_slice_read_bounds", "torch_prims_signbit", "models.delta_rule_inverse",
))


def _load_builtin() -> None:
    global _builtin_loaded
    if not _builtin_loaded:
        _builtin_loaded = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)
