"""``ExecutorchRunner``: runs a ``.pte``'s ``forward`` method on the ExecuTorch runtime (``executorch.runtime``).

Inputs are flattened through the typed signature (caches by their tensor leaves). The Python runtime cannot bind an
output onto an input's buffer (``Method::set_output_data_ptr`` is C++ only), so a cache the program updates comes
back among the method's outputs at every step; the runner writes it back into the caller's cache tensors, so the
call updates the caller's cache as eager PyTorch does, and returns that cache object.

A static cache kept as state (see :mod:`.state`) lives in the method's mutable buffers instead. The call still
takes the cache kwarg, as the source model does, and returns a cache object in the same place: the one it was
given, which stands for the state (its key/value tensors are not updated; :meth:`ExecutorchRunner.state` reads the
live values; its counters are). Passing back the object the last call returned continues the sequence; any other
cache object starts a new one: the buffers are loaded from that cache's tensors (an empty static cache, or a
prefill's output).

Threads: a method computes in memory planned into its program (arenas shared by the program's host-only methods)
and keeps a cache kept as state in its buffers, so calls into one program run one at a time: a lock kept on the
runtime program covers each call, from feeding its inputs (and loading a new sequence's state) to copying out its
outputs and counters. The pybinding holds the GIL through ``execute`` (measured: a Python thread gets ~2-4% of its
ticks during a 190 ms call), so two calls never overlapped; the lock keeps a stateful call, several runtime calls,
whole (load, execute, copy the counters back), and keeps calls serial where the runtime releases the GIL.
Per-thread methods would buy nothing while the GIL is held and are not cheap: the Python ``Program`` hands back its
one cached method, a method loaded again shares the program's arenas, and a program loaded per thread duplicates
its weights (and XNNPACK's packed copy of them). A sequence kept as state is therefore one per loaded program: a
thread whose sequence another thread's has replaced gets an error, not logits computed from the other's state.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

import torch
import torch.utils._pytree as pytree

from ...configs import ExportFormat
from ...errors import UnsupportedError
from ...metadata import ExportMetadata, IORole, LeafRole
from ...runner import ModelRunner, torch_single_thread
from .custom_sdpa import register_llama_kernels
from .targets import DELEGATES as _DELEGATES
from .memory import check_planned_memory, out_of_memory_at_load

__all__ = ["ExecutorchRunner", "program_lock", "runtime_program", "torch_single_thread"]

# Loading (the program, its kernels, a method) one thread at a time: two threads in the pybinding's load_method at
# once deadlocked (measured, executorch 1.5.1, 4 threads making their runners together), and a program loaded twice
# would get two sets of state and two locks. Reentrant: runtime_program takes it inside a runner's load.
_LOAD_LOCK = threading.RLock()


def runtime_program(program: Any) -> Any:
    """The ``executorch.runtime.Program`` of an exported ``ExecutorchProgramManager`` (loaded once per manager and
    kept on it) or of a program :meth:`ExecutorchExporter.load_program` read back."""
    from executorch.runtime import Program, Runtime

    from .weights import temporary_data

    if isinstance(program, Program):
        return program
    with _LOAD_LOCK:
        loaded = getattr(program, "_hfexport_runtime_program", None)
        if loaded is None:
            try:
                loaded = Runtime.get().load_program(program.buffer, data_path=temporary_data(program))
            except MemoryError as e:  # (the pybinding's loader can allocate a method's plan before check_planned_memory)
                raise UnsupportedError(out_of_memory_at_load(program)) from e
            program._hfexport_runtime_program = loaded
    return loaded


def _loaded_program(program: Any) -> Any:
    """The runtime ``Program`` of ``program`` where it is loaded already, ``None`` before :func:`runtime_program`."""
    from executorch.runtime import Program

    return program if isinstance(program, Program) else getattr(program, "_hfexport_runtime_program", None)


def program_lock(program: Any) -> Any:
    """The lock every call into the runtime ``program``'s methods holds (made once per program, kept on it)."""
    with _LOAD_LOCK:  # two runners made at once on one program must get the same lock
        lock = getattr(program, "_hfexport_lock", None)
        if lock is None:
            lock = program._hfexport_lock = threading.Lock()
    return lock


class _MethodSequence:
    """Which sequence a loaded method's state buffers hold: kept on the method, so every runner made over it (two
    threads making theirs at once, a later ``ExportedModel.to``) agrees on it.

    Attributes:
        handle: The cache object that stands for the state (the last call's), ``None`` before any or after a reset.
        last: Per thread, ``.cache``: a weak reference to that thread's last call's cache object.
    """

    def __init__(self) -> None:
        self.handle: Any = None
        self.last = threading.local()


def _method_sequence(method: Any) -> _MethodSequence:
    """The :class:`_MethodSequence` of a loaded method (made once, kept on it)."""
    with _LOAD_LOCK:
        sequence = getattr(method, "_hfexport_sequence", None)
        if sequence is None:
            sequence = method._hfexport_sequence = _MethodSequence()
    return sequence




def check_runtime_delegate(metadata: ExportMetadata) -> None:
    """Raise where this Python runtime does not register the delegate the program was lowered to.

    The runtime itself fails only at ``load_method`` with a bare error code. pip's ``executorch`` registers the CPU
    delegates (XNNPACK among them) and not CUDA's nor MLX's: those run from ExecuTorch's C++ runtime built with them.
    """
    backend = metadata.export_config.get("backend") or "xnnpack"
    delegate = _DELEGATES.get(backend)
    from executorch.extension.pybindings import portable_lib

    registered = list(portable_lib._get_registered_backend_names())
    if delegate is None or delegate in registered:
        return
    import importlib.metadata

    build = {"cuda": "-DEXECUTORCH_BUILD_CUDA=ON", "mlx": "-DEXECUTORCH_BUILD_MLX=ON"}.get(backend, "")
    raise UnsupportedError(
        f"this program is lowered for ExecutorchConfig(backend={backend!r}), whose delegate {delegate} this "
        f"ExecuTorch Python runtime (executorch {importlib.metadata.version('executorch')}) does not register (it has "
        f"{registered}). Run the .pte and its .ptd with an ExecuTorch runtime built with it ({build}), or export "
        "with backend='xnnpack' to run here"
    )


class ExecutorchRunner(ModelRunner):
    """Runs an ExecuTorch program; ``runner(**kwargs)`` returns what the source model returns.

    Args:
        program: An ``ExecutorchProgramManager`` (as exported) or an ``executorch.runtime.Program`` (as loaded).
        metadata: Its export metadata.
        device: Only ``"cpu"`` (or ``None``): a program runs where its delegate was lowered for.
        method: The method to run (default ``"forward"``).

    Example:
        >>> exported = ExecutorchExporter().export(model, inputs, ExecutorchConfig())
        >>> exported.runner()(**inputs).logits.shape
    """

    export_format = ExportFormat.EXECUTORCH

    def __init__(self, program: Any, metadata: ExportMetadata, device: Any = None, method: str = "forward"):
        super().__init__(metadata)
        if device is not None and torch.device(device).type != "cpu":
            raise UnsupportedError(
                f"the ExecuTorch runtime takes and returns CPU tensors; device={device!r} is not supported (a CUDA "
                "program moves its data to the GPU itself)"
            )
        check_runtime_delegate(metadata)
        self.program = program
        self.method_name = method
        with _LOAD_LOCK:
            if _uses_llama_kernels(metadata):
                register_llama_kernels()  # the method's llama::update_cache / custom_sdpa kernels, before loading it
            # load_method (and the pybinding's load_program before it) allocates the whole memory plan: refuse one
            # that does not fit before either does, which the OOM killer or a ulimit would stop
            check_planned_memory(program, _loaded_program(program), method,
                                 [s.name for s in metadata.inputs if s.role is not IORole.STATE])
            loaded = runtime_program(program)
            self.method = loaded.load_method(method)
            self._lock = program_lock(loaded)
            self._sequence = _method_sequence(self.method)
        self._binding = getattr(self.method, "_method", self.method)  # the pybinding's method under the wrapper
        # output index (program order) -> input index whose new value it is (a cache the program updates)
        in_index = {s.name: i for i, s in enumerate(metadata.inputs)}
        self._write_back = {
            i: in_index[s.target] for i, s in enumerate(metadata.outputs)
            if s.role is IORole.MUTATION and s.target in in_index
        }
        # a returned cache tensor that is an updated input is that input (as in eager PyTorch), not the copy the
        # program returns besides it
        mutated = {metadata.inputs[i].name: i for i in self._write_back.values()}
        self._aliases = {
            i: mutated[s.name] for i, s in enumerate(metadata.outputs)
            if s.role is IORole.CACHE_OUTPUT and s.name in mutated
        }
        # cache tensors kept as mutable buffers: input index -> buffer name; the other inputs are fed
        self._state = {i: s.target for i, s in enumerate(metadata.inputs) if s.role is IORole.STATE}
        self._fed = [i for i, s in enumerate(metadata.inputs) if s.role is not IORole.STATE]
        self._cache_key = metadata.cache_kwarg
        # "bshd": the program keeps each cache tensor as [batch, seq, heads, dim] (the llama custom ops' layout,
        # see .custom_sdpa), the caller's cache is [batch, heads, seq, dim]
        self._bshd = self._cache_key is not None and metadata.kwargs[self._cache_key].state_layout == "bshd"
        # write counters kept in the program too (the custom-op path): copied back into the caller's cache after
        # each call, so its counters follow the program's as on the other paths
        self._counters = [i for i in self._state if metadata.inputs[i].cache is not None
                          and metadata.inputs[i].cache.role is LeafRole.COUNTER]
        self._counter_buffers: list[torch.Tensor] | None = None
        self._with_handle = self._plan_handle_output() if self._state else None
        self.stateful = bool(self._state)  # generate()'s beam search reorders the state through reorder()
        self._constant_slots = self._plan_constant_slots()

    @classmethod
    def _create(cls, program: Any, metadata: ExportMetadata, device: Any = None, **runner_kwargs: Any):
        unknown = set(runner_kwargs) - {"method"}
        if unknown:
            raise TypeError(f"ExecutorchRunner takes method as its runner option, got {sorted(unknown)}")
        return cls(program, metadata, device=device, **runner_kwargs)

    # --- state --------------------------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the carried state: the next call loads the cache it is given."""
        with self._lock:
            self._sequence.handle = None
            self._sequence.last.cache = None

    def state(self) -> dict[str, torch.Tensor]:
        """The live cache tensors kept in the method, by input name (copies)."""
        names = self.metadata.inputs
        with self._lock:
            return {names[i].name: self._caller_layout(self._buffer(name)).clone() for i, name in self._state.items()}

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Reorder the batch rows of the cache kept in the method (beam search: each row follows its beam), in
        place in the method's buffers; a layer's write counter has no batch axis and stays."""
        index = beam_idx.to(torch.long)
        with self._lock:
            for i, name in self._state.items():
                if i in self._counters:
                    continue
                buffer = self._buffer(name)
                buffer.copy_(buffer.index_select(0, index))

    def _caller_layout(self, buffer: torch.Tensor) -> torch.Tensor:
        return buffer.transpose(1, 2) if self._bshd and buffer.dim() == 4 else buffer

    def _buffer(self, name: str) -> torch.Tensor:
        """The method's mutable buffer ``name``: a tensor over the method's own memory (writes land in the state)."""
        return self._binding.get_attribute(name)

    def _load_state(self, leaves: list[torch.Tensor]) -> None:
        for index, name in self._state.items():
            self._caller_layout(self._buffer(name)).copy_(leaves[index])

    # --- calling ------------------------------------------------------------------------------------------------

    def run(self, inputs: dict[str, Any], *, share_inputs: bool, share_outputs: bool) -> Any:
        if not self._state:
            return super().run(inputs, share_inputs=share_inputs, share_outputs=share_outputs)
        cache = inputs.get(self._cache_key) if self._cache_key else None
        if self._with_handle is None or cache is None:
            raise UnsupportedError(f"this export keeps its cache inside the program; pass {self._cache_key!r}")
        leaves = self.cast_inputs(self.flat_leaves(inputs), copy=not share_inputs)
        if self._bshd:
            _check_unpadded(inputs)
        with self._lock, torch_single_thread():
            if cache is not self._sequence.handle:
                self._check_not_displaced(cache)
                self._load_state(leaves)  # a new sequence: start from the caller's cache
            self._sequence.handle = cache
            self._remember(cache)
            outputs = self._run_flat(leaves)
            if self._counters:
                if self._counter_buffers is None:  # tensors over the method's memory: fetched once
                    self._counter_buffers = [self._buffer(self._state[i]) for i in self._counters]
                torch._foreach_copy_([leaves[i] for i in self._counters], self._counter_buffers)
        reduced, start, count = self._with_handle
        user = iter(outputs[len(outputs) - len(self.metadata.user_outputs):])
        out_leaves: list[Any] = []
        for i in range(self._out_spec.num_leaves):
            if i == start:
                out_leaves.append(cache)
            if start <= i < start + count:
                continue  # the cache's tensors: the program keeps them, the caller's cache object stands for them
            out_leaves.append(self._out_constants[i] if i in self._out_constants else next(user))
        return pytree.tree_unflatten(out_leaves, reduced)

    def _remember(self, cache: Any) -> None:
        """Record ``cache`` as the calling thread's sequence (weakly: a finished sequence's cache is not kept)."""
        thread = self._sequence.last
        last = getattr(thread, "cache", None)
        if last is None or last() is not cache:
            try:
                thread.cache = weakref.ref(cache)
            except TypeError:  # a cache class without weak references: no check for this thread
                thread.cache = None

    def _check_not_displaced(self, cache: Any) -> None:
        """Raise where ``cache`` continues this thread's sequence but another thread's has replaced it in the
        method's buffers since: loading it would restart from its stale tensors, silently wrong."""
        last = getattr(self._sequence.last, "cache", None)
        if last is not None and last() is cache:
            raise UnsupportedError(
                "this ExecuTorch export keeps its cache inside the program, one sequence per loaded program, and "
                "another thread ran (or reset) a sequence on it since this thread's last call, so this thread's "
                "cache no longer stands for the state. Load the export once per generating thread "
                "(ExportedModel.from_pretrained), or call runner.reset() and start over"
            )

    def _plan_handle_output(self) -> tuple | None:
        """The output tree with the cache subtree as one leaf (filled with the caller's cache object), the index of
        that leaf among the output leaves, and how many cache leaves it stands for."""
        spec, key = self._out_spec, self._cache_key
        if spec is None or key is None or not isinstance(spec.context, list) or key not in spec.context:
            return None
        position = spec.context.index(key)
        children = spec.children()
        start = sum(child.num_leaves for child in children[:position])
        count = children[position].num_leaves
        returned = spec.num_leaves - count - sum(1 for i in self._out_constants if not start <= i < start + count)
        if returned != len(self.metadata.user_outputs):
            raise UnsupportedError(
                f"the program returns {len(self.metadata.user_outputs)} outputs besides its cache, its output tree "
                f"holds {returned}: the cache kept as state is not the model's returned {key!r}"
            )
        reduced = pytree.TreeSpec(
            spec.type, spec.context, [pytree.treespec_leaf() if i == position else c for i, c in enumerate(children)]
        )
        return reduced, start, count

    def run_flat(self, inputs: list[torch.Tensor], *, share_outputs: bool) -> list[Any]:
        with self._lock, torch_single_thread():
            return self._run_flat(inputs)

    def _run_flat(self, inputs: list[torch.Tensor]) -> list[Any]:
        """Run on every flat input (those kept as state are not fed); write the updated ones back. The caller holds
        the program's lock."""
        feed = [inputs[i] for i in self._fed] if self._state else inputs
        feed = [t if t.is_contiguous() else t.contiguous() for t in feed]
        for slot, value in self._constant_slots:  # in slot order: each insert lands where the program expects it
            feed.insert(slot, value)
        # a constant output (None, an int) comes back as its value; the metadata keeps it in out_constants
        try:
            outputs = [o for o in self.method.execute(feed) if isinstance(o, torch.Tensor)]
        except RuntimeError as e:
            if "set_inputs" in str(e):
                raise self._refused_inputs(inputs, e) from e
            raise
        if len(outputs) != len(self.metadata.outputs):
            raise UnsupportedError(
                f"the program returned {len(outputs)} outputs, its metadata lists {len(self.metadata.outputs)}; was "
                "the .pte saved with the metadata of another export?"
            )
        for out_index, in_index in self._write_back.items():
            target = inputs[in_index]
            target.copy_(outputs[out_index])
            outputs[out_index] = target
        for out_index, in_index in self._aliases.items():
            outputs[out_index] = inputs[in_index]
        return self.checked(outputs)

    def _method_meta(self) -> Any:
        """The loaded method's metadata (input count, tensor sizes), or ``None`` where the binding has none."""
        return self._binding.method_meta() if callable(getattr(self._binding, "method_meta", None)) else None

    def _plan_constant_slots(self) -> list[tuple[int, Any]]:
        """The method's non-tensor inputs, as (slot, traced value): an input the export specialised to a constant
        (an int, a None) can stay an input of the ExecuTorch method, which must then be fed the traced value; the
        exporter recorded which (``metadata.program_constants``)."""
        slots = [(int(slot), value) for slot, value in self.metadata.program_constants]
        meta = self._method_meta()
        fed = len(self._fed) if self._state else len(self.metadata.inputs)
        if meta is not None and meta.num_inputs() != fed + len(slots):
            raise UnsupportedError(
                f"the ExecuTorch method {self.method_name!r} takes {meta.num_inputs()} inputs; its metadata lists "
                f"{fed} tensors and {len(slots)} constant inputs: was the .pte saved with the metadata of another "
                "export (or by an hfexport that did not record constant inputs)?"
            )
        return slots

    def planned_sizes(self) -> list[list[int] | None]:
        """The memory plan's sizes of each flat input: a dynamic dim's upper bound (``None``: one kept as state)."""
        meta = self._method_meta()
        bounds: list[list[int] | None] = [None] * len(self.metadata.inputs)
        if meta is not None:
            constant = {slot for slot, _ in self._constant_slots}
            tensor_slots = [slot for slot in range(meta.num_inputs()) if slot not in constant]
            for slot, i in zip(tensor_slots, self._fed if self._state else range(len(bounds))):
                try:
                    bounds[i] = list(meta.input_tensor_meta(slot).sizes())
                except (RuntimeError, IndexError):
                    pass
        return bounds

    def _refused_inputs(self, inputs: list[torch.Tensor], error: RuntimeError) -> UnsupportedError:
        """The runtime's bare ``set_inputs`` error code, explained: which input the program cannot take, and why."""
        problems = self.shape_problems(inputs, self.planned_sizes()) or [
            "every input's shape fits the traced signature; a dtype or a size between traced bounds may still differ"
        ]
        return UnsupportedError(
            f"the ExecuTorch program ({self.method_name!r}) cannot take its inputs: " + "; ".join(problems[:3])
            + f" ({error}). A static size is fixed at export: re-export with the sample shape you run, or with "
            "dynamic shapes that cover it."
        )


def _uses_llama_kernels(metadata: ExportMetadata) -> bool:
    return any(v.get("state_layout") == "bshd" for v in metadata.kwargs.values())


def _check_unpadded(inputs: dict[str, Any]) -> None:
    """The llama custom ops attend causally to every written slot: a padding mask cannot be honoured."""
    from .custom_sdpa import unpadded_causal

    if not unpadded_causal(inputs.get("attention_mask")):
        raise UnsupportedError(
            "this export attends with ExecuTorch's llama::custom_sdpa (causal, no padding mask; taken for a batch-1 "
            "unpadded sample), and this attention_mask pads or is not causal; export with a padded batch sample for "
            "the SDPA path"
        )
