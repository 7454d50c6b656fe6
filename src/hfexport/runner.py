"""``ModelRunner``: run one exported program on its backend and give back what the source model returns.

The base class does the backend-independent half: pick the traced kwargs out of what the caller passes (a whole
processor output is fine), check the constants the graph was specialised on, flatten the inputs in the
signature's order (casting dtypes where the caller's differ, e.g. an ``int32`` mask), and rebuild the model's
own output types from the program's flat outputs. A backend implements :meth:`ModelRunner.run_flat`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch
import torch.utils._pytree as pytree

from .derived import derive
from .errors import HfExportError, UnsupportedError
from .metadata import ExportMetadata, IORole, KwargKind, LeafRole
from .pytrees import load_spec, tensor_leaves

__all__ = ["ModelRunner", "torch_single_thread"]

_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


def additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean 4D attention mask (``True``: attend) as the additive one a graph traced with a prepared float mask
    adds to its scores (eager attention): 0 where it attends, the dtype's lowest value elsewhere, as transformers'
    ``eager_mask`` builds it. A plain cast would give 1 and 0, and 0 masks nothing."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, torch.finfo(dtype).min)


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


@contextlib.contextmanager
def torch_single_thread() -> Iterator[None]:
    """Run torch's own work on one thread while another runtime (ONNX Runtime, OpenVINO, XNNPACK) computes.

    torch's OpenMP workers spin-wait for a while after every parallel region (libgomp's default wait policy): the
    small torch ops around a runtime call (an argmax over the vocabulary, a copy of a cache tensor) go parallel,
    and the spinning workers then take the cores the runtime's own threads wait for. Measured on 2 cores:
    ExecuTorch, a 2-layer SmolLM2 step 163 ms with torch's default threads, 6 ms with one; ONNX Runtime, SmolLM2
    decode 42.6 tok/s with torch's default threads around the loop, 58-59 tok/s with one (same graph, quiet machine).
    The caller's setting comes back on exit.
    """
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


#: why a grid's first dim (the number of images or videos) is static, and what to do
COUNT_HINT = (": the number of images (videos) is fixed at trace time, the model splitting its features per image by "
              "sizes read from the grid; export with as many as you will run, or with export_for_generation, whose "
              "image encoder takes any number")


class ModelRunner:
    """Runs one exported program: ``runner(**kwargs)`` returns what the source model returns.

    Example:
        >>> runner = ModelRunner.from_program(exported.program, exported.components["model"].metadata)
        >>> runner(**inputs).logits.shape
    """

    export_format: ClassVar[Any] = None
    computes_with_torch: ClassVar[bool] = False
    """Whether the program's own compute is torch's (Dynamo): else a generation loop keeps torch on one thread
    (:func:`torch_single_thread`), leaving the cores to the runtime."""

    def __init__(self, metadata: ExportMetadata):
        self.metadata = metadata
        self._traced_keys = [k for k, v in metadata.kwargs.items() if v.traced]
        self._flags = {k for k, v in metadata.kwargs.items() if not v.traced}
        self._constants = {k for k, v in metadata.kwargs.items() if v.kind is KwargKind.CONSTANT}
        self._constant_lists = _constant_lists(metadata)  # (image_sizes traced as a list: hf_model.VALUE_INPUTS)
        self._tensor_inputs = list(metadata.inputs)
        self._input_dtypes = [torch_dtype(s.dtype) for s in self._tensor_inputs]
        self._out_spec = load_spec(metadata.out_spec) if metadata.out_spec else None
        self._n_user = len(metadata.user_outputs)
        self._assumptions = list(metadata.assumptions)
        self._out_constants = {int(i): v for i, v in metadata.out_constants}
        self._warned_dropped: set[str] = set()

    @property
    def output_device(self) -> torch.device:
        """Where this runner returns its tensors, and so where a generation loop around it keeps its own."""
        return torch.device("cpu")

    # --- construction ---------------------------------------------------------------------------------------------

    @classmethod
    def from_program(cls, program: Any, metadata: ExportMetadata, device: Any = None, **runner_kwargs: Any) -> ModelRunner:
        """A runner for ``program`` (as exported, or as read back by ``load_program``) on ``device``.

        Called on ``ModelRunner`` itself, dispatches to the runner registered for the metadata's export format.
        """
        if cls is ModelRunner:
            from .registry import runner_class_for

            fmt = metadata.export_config.get("export_format", "dynamo")
            return runner_class_for(fmt).from_program(program, metadata, device=device, **runner_kwargs)
        return cls._create(program, metadata, device=device, **runner_kwargs)

    @classmethod
    def _create(cls, program: Any, metadata: ExportMetadata, device: Any = None, **runner_kwargs: Any) -> ModelRunner:
        raise NotImplementedError(f"{cls.__name__} must implement _create")

    # --- calling ------------------------------------------------------------------------------------------------

    def __call__(self, share_inputs: bool = True, share_outputs: bool = False, **kwargs: Any) -> Any:
        """Run the program on ``kwargs`` (extra kwargs are dropped with one warning naming them).

        Args:
            share_inputs: Let the backend read the caller's tensors in place (no copy); an in-place cache update then
                lands in the caller's cache. ``False`` copies inputs first, leaving the caller's tensors untouched.
            share_outputs: Let the outputs alias the runner's own buffers, valid until the next call (no copy).
        """
        inputs = self.select_inputs(kwargs)
        try:
            return self.run(inputs, share_inputs=share_inputs, share_outputs=share_outputs)
        except HfExportError:
            raise
        except Exception as e:
            # diagnosed only once the runtime refused: nothing on the per-call path
            problems = self._input_problems(inputs)
            if not problems:
                raise
            raise UnsupportedError(
                f"the inputs do not fit this export: {'; '.join(problems[:5])}. Pass inputs shaped and typed like the "
                "sample inputs it was traced with (a batch dimension first), or re-export with such samples"
            ) from e

    def _input_problems(self, inputs: Mapping[str, Any]) -> list[str]:
        try:
            leaves = self.flat_leaves(inputs)
        except HfExportError as e:
            return [str(e)]
        return self.shape_problems(leaves)

    def select_inputs(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The traced kwargs, in traced order; warns once about dropped ones and checks specialised constants."""
        dropped = [k for k in kwargs if k not in self.metadata.kwargs and kwargs[k] is not None]
        new = [k for k in dropped if k not in self._warned_dropped]
        if new:
            self._warned_dropped.update(new)
            warnings.warn(
                f"inputs {new} were not traced by this export and are ignored "
                f"(traced inputs: {self._traced_keys})",
                stacklevel=3,
            )
        for key in self._flags.intersection(kwargs):
            self._check_constant(key, kwargs[key])
        if self.metadata.derived_inputs:  # (a vision tower's offsets from its grid: computed as the model does)
            kwargs = {**kwargs, **derive(self.metadata.derived_inputs, kwargs)}
        selected: dict[str, Any] = {}
        missing = []
        for key in self._traced_keys:
            constant = key in self._constants  # read once at init: this runs at every decode step
            if key in kwargs:
                value = kwargs[key]
                if constant:
                    self._check_constant(key, value)
                elif key in self._constant_lists:
                    value = self._check_constant_list(key, value)
                selected[key] = value
            elif constant:
                selected[key] = self.metadata.in_constants.get(key)
            elif key == "logits_to_keep" and (every := _every_position(kwargs)) is not None:
                selected[key] = every  # the forward's default (0): the logits of every query position
            else:
                missing.append(key)
        if missing:
            raise UnsupportedError(
                f"missing inputs {missing}: this export was traced with {self._traced_keys}; pass them, or re-export "
                "with sample inputs that leave them out"
            )
        return selected

    def _check_constant_list(self, key: str, value: Any) -> Any:
        """The traced list of ``key`` where ``value`` (a tensor or a list) holds the same numbers, else
        :class:`UnsupportedError`."""
        traced = self._constant_lists[key]
        given = value.tolist() if isinstance(value, torch.Tensor) else _as_lists(value)
        if given != traced:
            raise UnsupportedError(
                f"input {key!r}={given!r} differs from the values this export was specialised on ({traced!r}): the "
                f"model sizes its tensors from them in Python; re-export with {key}={given!r} in the sample inputs"
            )
        return traced

    def _check_constant(self, key: str, value: Any) -> None:
        if key in self.metadata.in_constants:
            traced = self.metadata.in_constants[key]
            if value != traced and not (value is None and traced is None):
                raise UnsupportedError(
                    f"input {key!r}={value!r} differs from the value the graph was specialised on ({traced!r}); "
                    f"re-export with {key}={value!r} in the sample inputs"
                )

    def run(self, inputs: dict[str, Any], *, share_inputs: bool, share_outputs: bool) -> Any:
        """Run on selected inputs. The default flattens, calls :meth:`run_flat`, and unflattens."""
        flat = self.flatten(inputs, copy=not share_inputs)
        outputs = self.run_flat(flat, share_outputs=share_outputs)
        return self.unflatten(outputs)

    def flatten(self, inputs: Mapping[str, Any], copy: bool = False) -> list[torch.Tensor]:
        """The tensor inputs in the program's order (a fresh static cache's layers allocated, see
        :meth:`initialize_lazy_caches`), cast to the traced dtypes."""
        return self.cast_inputs(self.flat_leaves(inputs), copy)

    def flat_leaves(self, inputs: Mapping[str, Any]) -> list[torch.Tensor]:
        """The tensor leaves of ``inputs`` in the program's order, not cast (:func:`~hfexport.pytrees.tensor_leaves`
        reads caches through their tensors, without building a pytree context)."""
        leaves = tensor_leaves(dict(inputs))
        if len(leaves) != len(self._tensor_inputs) and self.initialize_lazy_caches(inputs):
            leaves = tensor_leaves(dict(inputs))
        return self._checked(leaves)

    def initialize_lazy_caches(self, inputs: Mapping[str, Any]) -> bool:
        """Allocate the layers of a ``StaticCache`` that no update has initialized yet (transformers allocates them
        lazily, on the first forward), shaped like the traced cache, with the call's batch: what the eager forward
        does with a fresh cache, so a captured prefill's empty cache runs as it is. Returns whether it did."""
        key = self.metadata.cache_kwarg
        cache = inputs.get(key) if key else None
        layers = getattr(cache, "layers", None)
        if not layers or all(getattr(layer, "is_initialized", True) for layer in layers) or \
                not hasattr(cache, "early_initialization"):
            return False
        keys = [s for s in self.metadata.cache_leaves(LeafRole.KEYS) if s.example_shape]
        batched = [v for k, v in inputs.items() if k != key and isinstance(v, torch.Tensor) and v.dim() > 0]
        if len(keys) != len(layers) or not batched:
            return False
        cache.early_initialization(
            batch_size=int(batched[0].shape[0]), num_heads=[int(s.example_shape[1]) for s in keys],
            head_dim=[int(s.example_shape[-1]) for s in keys], dtype=torch_dtype(keys[0].dtype),
            device=batched[0].device,
        )
        return True

    def _checked(self, leaves: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(leaves) != len(self._tensor_inputs):
            names = [s.name for s in self._tensor_inputs]
            raise UnsupportedError(
                f"the inputs flatten to {len(leaves)} tensors but the export takes {len(names)}: {names}"
            )
        return leaves

    def planned_sizes(self) -> list[list[int] | None]:
        """Per flat input (the program's order), the largest sizes the runtime takes where it plans its memory
        ahead of time (ExecuTorch); ``None`` where the traced signature alone decides."""
        return [None] * len(self._tensor_inputs)

    def shape_problems(self, leaves: list[torch.Tensor], bounds: list[list[int] | None] | None = None) -> list[str]:
        """What in ``leaves`` (flat, in the program's order) the traced signature does not take: a rank, a static
        size, or a dynamic size over its bound (``bounds``: the largest sizes per leaf, where the runtime knows
        them). For an error message once a runtime has refused the inputs, not for the per-step path."""
        problems = []
        for i, (leaf, spec) in enumerate(zip(leaves, self._tensor_inputs)):
            got, want = list(leaf.shape), list(spec.shape)
            bound = bounds[i] if bounds and i < len(bounds) else None
            if len(got) != len(want):
                problems.append(f"{spec.name!r} {got}: the export takes rank {len(want)} {want}")
                continue
            for d, (size, expected) in enumerate(zip(got, want)):
                if isinstance(expected, int) and size != expected:
                    problems.append(f"{spec.name!r} {got}: dim {d} is static at {expected} (traced "
                                    f"{spec.example_shape or want}){COUNT_HINT if d == 0 and 'grid' in spec.name else ''}")
                    break
                if bound is not None and d < len(bound) and size > bound[d]:
                    problems.append(f"{spec.name!r} {got}: dim {d} ({expected}) goes up to {bound[d]}")
                    break
        return problems

    def cast_inputs(self, leaves: list[torch.Tensor], copy: bool) -> list[torch.Tensor]:
        """Each leaf in its traced dtype; ``copy`` clones the ones a cast did not already copy."""
        flat = []
        for index, (leaf, dtype) in enumerate(zip(leaves, self._input_dtypes)):
            if leaf.dtype != dtype:
                leaf = self.cast_leaf(leaf, self._tensor_inputs[index].name, dtype)
            elif copy:
                leaf = leaf.clone()
            flat.append(leaf)
        return flat

    def cast_leaf(self, leaf: torch.Tensor, name: str, dtype: torch.dtype) -> torch.Tensor:
        """``leaf`` (not of ``dtype``) as the input ``name`` takes it: a boolean 4D mask fed to a float one becomes
        the additive mask (:func:`additive_mask`); a float fed to an integer input must hold whole numbers."""
        if leaf.dtype == torch.bool and dtype.is_floating_point and leaf.dim() == 4:
            return additive_mask(leaf, dtype)
        self._check_whole(leaf, name, dtype)
        return leaf.to(dtype)

    def _check_whole(self, leaf: torch.Tensor, name: str, dtype: torch.dtype) -> None:
        """A float tensor fed to an integer input (token ids, a mask) casts exactly only if it holds whole numbers;
        otherwise the cast would silently change it (eager PyTorch raises on float ids). Called only where a cast
        happens; does nothing unless it is float to integer."""
        if not leaf.is_floating_point() or dtype.is_floating_point or dtype.is_complex:
            return
        if leaf.numel() and not bool(torch.isfinite(leaf).all() and torch.equal(leaf, leaf.trunc())):
            raise UnsupportedError(
                f"input {name!r} is {str(leaf.dtype).removeprefix('torch.')} with fractional or non-finite values, "
                f"and this export takes {str(dtype).removeprefix('torch.')}: pass integers (e.g. .long()), as the "
                "model itself requires"
            )

    def run_flat(self, inputs: list[torch.Tensor], *, share_outputs: bool) -> list[Any]:
        """Run the program on flat tensor inputs; return its flat outputs (mutations first, user outputs last)."""
        raise NotImplementedError

    def checked(self, outputs: list) -> list:
        """The program's flat outputs without its assumption checks (the last ones, see
        :mod:`hfexport.capture.assumptions`), once each is true; a backend's runner calls it on what the runtime
        returned.

        Raises:
            UnsupportedError: An input took a branch of the model other than the one the export was traced on.
        """
        if not self._assumptions:
            return outputs
        count = len(self._assumptions)
        failed = [text for text, flag in zip(self._assumptions, outputs[-count:]) if not bool(flag)]
        if failed:
            raise UnsupportedError(
                f"these inputs take another branch of {self.metadata.architecture}'s data-dependent code than the "
                f"sample it was traced with, which the export assumed ({'; '.join(failed)}): re-export with sample "
                "inputs that take the branch you run, or export that branch as its own graph"
            )
        return outputs[:-count]

    def unflatten(self, outputs: list) -> Any:
        """Rebuild the model's outputs from the program's flat ones (which come last) and the recorded constants."""
        user = list(outputs[len(outputs) - self._n_user :]) if self._n_user else []
        if self._out_spec is None:
            return user
        leaves: list[Any] = []
        it = iter(user)
        for i in range(self._out_spec.num_leaves):
            leaves.append(self._out_constants[i] if i in self._out_constants else next(it))
        return pytree.tree_unflatten(leaves, self._out_spec)

    # --- helpers for backends -------------------------------------------------------------------------------------

    def specs(self, role: IORole) -> list:
        return [s for s in (*self.metadata.inputs, *self.metadata.outputs) if s.role is role]


def _constant_lists(metadata: ExportMetadata) -> dict[str, list]:
    """``{kwarg: nested list}`` for each traced kwarg that is a list of constants only (its leaves in
    ``in_constants`` as ``key.i.j``), rebuilt from those leaves."""
    lists: dict[str, list] = {}
    for key, spec in metadata.kwargs.items():
        if spec.kind is not KwargKind.PYTREE or spec.get("type") != "list":
            continue
        leaves = {name[len(key) + 1:]: v for name, v in metadata.in_constants.items() if name.startswith(f"{key}.")}
        if (not leaves or any(s.name.startswith(f"{key}.") for s in metadata.inputs)
                or not all(part.isdigit() for path in leaves for part in path.split("."))):
            continue  # (tensors in it, or not a nested list: a list of dicts of constants)
        built: list = []
        for path, value in leaves.items():
            _place(built, [int(i) for i in path.split(".")], value)
        lists[key] = built
    return lists


def _as_lists(value: Any) -> Any:
    """Tuples as lists, all the way down (``[(h, w), ...]`` compares equal to the traced ``[[h, w], ...]``)."""
    return [_as_lists(v) for v in value] if isinstance(value, (list, tuple)) else value


def _place(node: list, path: list[int], value: Any) -> None:
    first, *rest = path
    while len(node) <= first:
        node.append([] if rest else None)
    if rest:
        _place(node[first], rest, value)
    else:
        node[first] = value


def _every_position(kwargs: Mapping[str, Any]) -> torch.Tensor | None:
    """The index of every query position of a call (``logits_to_keep`` traced as the positions the LM head projects,
    see :func:`hfexport.capture.decompose.keep_every_position`), ``None`` where the call has no query tokens."""
    for key in ("input_ids", "inputs_embeds"):
        value = kwargs.get(key)
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return torch.arange(value.shape[1], device=value.device)
    return None
