"""``OnnxRunner``: runs an exported ONNX graph on ONNX Runtime through io-binding.

Inputs are bound by pointer (no copy) in signature order, under the names :func:`~.names.io_names` gives them, and
stay bound while their buffer does not change; outputs come back as torch tensors on ONNX Runtime's buffers (DLPack,
no copy). In in-place mode (the default) a static cache never leaves its buffers: each cache output that is the new
value of a cache input is bound onto that input's buffer, so ONNX Runtime writes the update where the cache lives
(or, where the graph still reads the old value after writing the new one, the small update is copied back), and the
call returns the caller's own cache object, updated, as the Dynamo backend and eager PyTorch do.

Threads: ``InferenceSession.run*`` is thread-safe, an ``IOBinding`` is not (it is the list of bound buffers, and
``get_outputs`` reads the last run's). Each thread gets its own binding and its own record of what is bound
(a ``threading.local``), so calls from several threads run at once, and one thread's decode steps still skip
rebinding the buffers that did not change.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from ...configs import ExportFormat
from ...errors import UnsupportedError
from ...metadata import ExportMetadata, IORole
from ...runner import ModelRunner
from .inplace import safe_in_place_pairs
from .names import in_place_pairs, io_names
from .session import check_providers, default_providers, session_for

__all__ = ["OnnxRunner"]

_NUMPY = {
    torch.float32: np.float32, torch.float16: np.float16, torch.float64: np.float64, torch.int64: np.int64,
    torch.int32: np.int32, torch.int16: np.int16, torch.int8: np.int8, torch.uint8: np.uint8, torch.bool: np.bool_,
}


class OnnxRunner(ModelRunner):
    """Runs an ``onnx_ir.Model`` on ONNX Runtime; ``runner(**kwargs)`` returns what the source model returns.

    Args:
        program: The exported graph (as exported, or as :meth:`OnnxExporter.load_program` read it back).
        metadata: Its export metadata (the typed signature names and orders its inputs and outputs).
        device: ``"cpu"`` (default) or ``"cuda"``: where inputs are bound and outputs allocated.
        providers: ONNX Runtime execution providers (default: the one for ``device``).
        session_options: An ``onnxruntime.SessionOptions``.
        in_place: Update static caches in their own buffers (default). ``False`` returns new cache tensors and
            leaves the inputs untouched.

    Example:
        >>> exported = OnnxExporter().export(model, inputs, OnnxConfig(dynamic=True))
        >>> exported.to("cpu", providers=["CPUExecutionProvider"])(**inputs).logits
    """

    export_format = ExportFormat.ONNX

    def __init__(
        self,
        program: Any,
        metadata: ExportMetadata,
        device: Any = None,
        providers: list | None = None,
        session_options: Any = None,
        in_place: bool = True,
    ):
        super().__init__(metadata)
        self.program = program
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        providers = providers or default_providers(device)
        check_providers(providers, device)
        self.session = session_for(program, providers, session_options)
        self._in_names, self._out_names = io_names(metadata)
        found = {i.name for i in self.session.get_inputs()}
        if set(self._in_names) != found:
            raise UnsupportedError(
                f"the ONNX graph's inputs {sorted(found)} do not match its export metadata ({self._in_names}); was the "
                "graph edited, or saved with the metadata of another export?"
            )
        self._updates = in_place_pairs(metadata) if in_place else {}  # output index -> input index
        # bound onto the input's buffer where nothing reads the old value after the write; the rest is copied back
        self._bound_in_place = safe_in_place_pairs(program, self._updates, self._in_names, self._out_names)
        self._local = threading.local()  # per thread: .binding and .bound (see _thread_binding)
        self._device_type, self._device_id = self.device.type, self.device.index or 0
        self._cache_key = metadata.cache_kwarg
        self._same_cache = self._plan_same_cache_output()

    @property
    def output_device(self) -> torch.device:
        return self.device

    @classmethod
    def _create(cls, program: Any, metadata: ExportMetadata, device: Any = None, **runner_kwargs: Any) -> OnnxRunner:
        unknown = set(runner_kwargs) - {"providers", "session_options", "in_place"}
        if unknown:
            raise TypeError(
                f"OnnxRunner takes providers, session_options and in_place as runner options, got {sorted(unknown)}"
            )
        return cls(program, metadata, device=device, **runner_kwargs)

    @property
    def in_place_outputs(self) -> list[str]:
        """Names of the outputs ONNX Runtime writes straight into their input's buffer."""
        return [self._out_names[i] for i in sorted(self._bound_in_place)]

    @property
    def copied_back_outputs(self) -> list[str]:
        """Names of the cache outputs copied into their input's buffer after the run (read after being written)."""
        return [self._out_names[i] for i in sorted(set(self._updates) - set(self._bound_in_place))]

    # --- calling ------------------------------------------------------------------------------------------------

    def run(self, inputs: dict[str, Any], *, share_inputs: bool, share_outputs: bool) -> Any:
        leaves = self.flat_leaves(inputs)
        flat = self.cast_inputs(leaves, copy=not share_inputs)
        outputs = self.run_flat(flat, share_outputs=share_outputs)
        cache = inputs.get(self._cache_key) if self._same_cache is not None else None
        # the caller's cache object is the answer only if its own tensors were the ones updated (not cast copies)
        if cache is not None and all(flat[i] is leaves[i] for i in self._updates.values()):
            return self._unflatten_with_cache(outputs, cache)
        return self.unflatten(outputs)

    def flatten(self, inputs: dict[str, Any], copy: bool = False) -> list[torch.Tensor]:
        """As :meth:`ModelRunner.flatten`, with caches flattened without building their tree context."""
        return self.cast_inputs(self.flat_leaves(inputs), copy)

    def run_flat(self, inputs: list[torch.Tensor], *, share_outputs: bool) -> list[Any]:
        binding, held = self._thread_binding()
        bound = []
        for name, tensor in zip(self._in_names, inputs):
            if tensor.device != self.device:
                tensor = tensor.to(self.device)
            if not tensor.is_contiguous():
                tensor = tensor.contiguous()
            self._bind(binding, held, "input", name, tensor)
            bound.append(tensor)
        for index, name in enumerate(self._out_names):
            source = self._bound_in_place.get(index)
            if source is not None:
                self._bind(binding, held, "output", name, bound[source])
            else:
                held.pop(("output", name), None)
                binding.bind_output(name, self._device_type, self._device_id)  # a fresh buffer at every call
        self.session.run_with_iobinding(binding)
        values = binding.get_outputs()
        outputs: list[Any] = []
        for index, value in enumerate(values):
            source = self._updates.get(index)
            if source is None:
                outputs.append(_to_torch(value))
                continue
            if index not in self._bound_in_place:
                bound[source].copy_(_to_torch(value))
            if bound[source] is not inputs[source]:  # bound a contiguous or moved copy: write the update back
                inputs[source].copy_(bound[source])
            outputs.append(inputs[source])
        return self.checked(outputs)

    def _thread_binding(self) -> tuple[Any, dict[tuple, tuple]]:
        """The calling thread's io-binding and its record of what is bound, made on the thread's first call."""
        local = self._local
        try:
            return local.binding, local.bound
        except AttributeError:
            local.binding, local.bound = self.session.io_binding(), {}
            return local.binding, local.bound

    def _bind(self, binding: Any, held: dict[tuple, tuple], kind: str, name: str, tensor: torch.Tensor) -> None:
        """Bind ``tensor`` by pointer, unless ``held`` (what ``binding`` holds) says it is bound already."""
        key = (kind, name)
        signature = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype)
        if held.get(key) == signature:
            return  # still bound to this very buffer
        dtype = _NUMPY.get(tensor.dtype)
        if dtype is None or tensor.numel() == 0:  # bfloat16 (no numpy dtype) or no buffer: hand over the tensor
            import onnxruntime as ort

            getattr(binding, f"bind_ortvalue_{kind}")(name, ort.OrtValue.from_dlpack(tensor))
            held.pop(key, None)  # the OrtValue holds the tensor: rebind next time
            return
        bind = binding.bind_input if kind == "input" else binding.bind_output
        bind(name, self._device_type, self._device_id, dtype, signature[1], signature[0])
        held[key] = signature

    # --- the caller's cache object as the output's --------------------------------------------------------------

    def _plan_same_cache_output(self) -> tuple | None:
        """When every cache output is written into the cache input it updates, the call returns the caller's cache
        object itself: ``(spec with that cache as one leaf, first leaf, leaf count)`` to rebuild the rest."""
        spec, key = self._out_spec, self._cache_key
        if spec is None or key is None or not self._updates or not isinstance(spec.context, list):
            return None
        if key not in spec.context:
            return None
        position = spec.context.index(key)
        children = spec.children()
        start = sum(child.num_leaves for child in children[:position])
        count = children[position].num_leaves
        user = self.metadata.user_outputs
        cache_outputs = [i for i, s in enumerate(user) if s.role is IORole.CACHE_OUTPUT]
        if len(cache_outputs) != count or set(cache_outputs) != set(self._updates) or self._out_constants:
            return None
        reduced = pytree.TreeSpec(
            spec.type, spec.context, [pytree.treespec_leaf() if i == position else c for i, c in enumerate(children)]
        )
        return reduced, start, count

    def _unflatten_with_cache(self, outputs: list, cache: Any) -> Any:
        reduced, start, count = self._same_cache
        user = list(outputs[len(outputs) - self._n_user :])
        leaves = user[:start] + [cache] + user[start + count :]
        return pytree.tree_unflatten(leaves, reduced)


def _to_torch(value: Any) -> torch.Tensor:
    """An ORT-allocated output as a torch tensor on the same buffer (DLPack keeps the buffer alive)."""
    try:
        return torch.from_dlpack(value._ortvalue.to_dlpack())
    except (AttributeError, RuntimeError, TypeError):
        return torch.from_numpy(value.numpy())
