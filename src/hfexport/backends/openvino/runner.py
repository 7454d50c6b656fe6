"""``OpenVINORunner``: runs an exported ``openvino.Model`` on OpenVINO Runtime.

Inputs go in by pointer (numpy views of the torch tensors) under the names the signature gives them; outputs come
back as torch tensors. Precision: OpenVINO's CPU plugin computes in bf16 on processors that have it and stores a
stateful KV cache as u8, even for an fp32 model, which changes greedy tokens; an fp32 export is compiled with an f32
precision hint and an f32 KV cache unless the caller's ``config`` says otherwise (``{"INFERENCE_PRECISION_HINT":
"bf16"}`` is the explicit bf16 option).

A stateful graph keeps the cache in variables. The call still takes the cache kwarg, as the source model does, and
returns a cache object in the same place: the one it was given, which stands for the state (its tensors are not
updated; :meth:`OpenVINORunner.state` reads the live values). Passing back the object the last call returned
continues the sequence; any other cache object starts a new one: the state is reset and loaded from that cache's
tensors (an empty static cache, or a prefill's output).

Threads: an infer request is one call at a time ("Infer Request is busy") and holds the last call's outputs and a
stateful model's variables, while the compiled model is shared and thread-safe. Each thread gets its own infer
request, with its own sequence (the cache object standing for its state, a pending beam reorder), so several
threads call one runner at once and each carries its own generation; :meth:`OpenVINORunner.reset`,
:meth:`~OpenVINORunner.reorder` and :meth:`~OpenVINORunner.state` act on the calling thread's.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import numpy as np
import torch
import torch.utils._pytree as pytree

from ...configs import ExportFormat
from ...errors import UnsupportedError
from ...metadata import ExportMetadata
from ...runner import ModelRunner
from .causal import fused_with_state, use_plugin_causal
from .convert import input_names, output_names
from .stateful import BEAM_IDX, state_pairs, variable_id

__all__ = ["OpenVINORunner", "compile_properties"]

logger = logging.getLogger(__name__)

_F32_DEFAULTS = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}


def compile_properties(metadata: ExportMetadata, config: dict | None, device: str = "CPU",
                       torch_threads: int | None = None) -> dict[str, Any]:
    """The compile properties: on CPU, latency-oriented, the cores torch does not keep (``torch_threads``), and f32
    precision for an fp32 export; the caller's ``config`` overrides each of them."""
    properties = dict(config or {})
    if device != "CPU":
        return properties
    properties.setdefault("PERFORMANCE_HINT", "LATENCY")
    if torch_threads is not None:
        properties.setdefault("INFERENCE_NUM_THREADS", max(1, (os.cpu_count() or 1) - int(torch_threads)))
    if metadata.export_dtype in (None, "float32"):
        hint = properties.setdefault("INFERENCE_PRECISION_HINT", "f32")
        properties.setdefault("KV_CACHE_PRECISION", str(hint) if str(hint) in ("f32", "bf16", "f16") else "f32")
    return properties


class _Sequence:
    """One thread's infer request and the sequence it carries.

    Attributes:
        request: The thread's ``openvino.InferRequest`` (a stateful model's variables live in it).
        handle: The cache object that stands for the request's state (the last call's), ``None`` before any.
        beam_idx: A beam reorder to apply at the next call, ``None`` for none.
    """

    __slots__ = ("request", "handle", "beam_idx")

    def __init__(self, request: Any):
        self.request = request
        self.handle: Any = None
        self.beam_idx: torch.Tensor | None = None


class OpenVINORunner(ModelRunner):
    """Runs an ``openvino.Model`` on OpenVINO Runtime; ``runner(**kwargs)`` returns what the source model returns.

    Args:
        program: The exported model (as exported, or as :meth:`OpenVINOExporter.load_program` read it back).
        metadata: Its export metadata.
        device: ``"cpu"`` (default), or an OpenVINO device name (``"GPU"``, ``"NPU"``).
        config: Compile properties for ``Core.compile_model`` (they override the f32 defaults of an fp32 export).
        torch_threads: Threads torch keeps (``torch.set_num_threads``) for the work around the model; OpenVINO
            runs on the other cores (``INFERENCE_NUM_THREADS``), so the two thread pools do not contend.

    Example:
        >>> exported = OpenVINOExporter().export(model, inputs, OpenVINOConfig(dynamic=True))
        >>> exported.to("cpu", config={"INFERENCE_NUM_THREADS": 2})(**inputs).logits
    """

    export_format = ExportFormat.OPENVINO

    def __init__(self, program: Any, metadata: ExportMetadata, device: Any = None, config: dict | None = None,
                 torch_threads: int | None = None):
        super().__init__(metadata)
        if torch_threads is not None:
            torch.set_num_threads(int(torch_threads))
        self.program = program
        self.device = _device_name(device)
        self.properties = compile_properties(metadata, config, self.device, torch_threads)
        self.compiled = _compile(program, self.device, self.properties)
        self._local = threading.local()  # per thread: .sequence (see _sequence)
        self._sequence()  # the loading thread's request now, so a device that cannot make one fails at load
        names = [set(port.get_names()) for port in self.compiled.inputs]
        self.stateful = any(BEAM_IDX in n for n in names)
        self._pairs = state_pairs(metadata) if self.stateful else {}
        all_in = input_names(metadata)
        position = {name: i for i, name in enumerate(all_in)}
        self._fed: list[int] = []  # metadata input index fed at each compiled input (-1: beam_idx)
        for port_names in names:
            found = [position[n] for n in port_names if n in position]
            if not found and BEAM_IDX not in port_names:
                raise UnsupportedError(f"the OpenVINO model's input {sorted(port_names)} is not in its export metadata")
            self._fed.append(found[0] if found else -1)
        outs = output_names(metadata)
        kept = [n for n in outs if n not in set(self._pairs.values())]
        got = [next(iter(port.get_names()), "") for port in self.compiled.outputs]
        if len(got) != len(kept):
            raise UnsupportedError(f"the OpenVINO model returns {len(got)} outputs, its metadata expects {kept}")
        self._batch_input = next((i for i, s in enumerate(metadata.inputs) if s.role.value == "input" and s.shape), 0)
        self._state_inputs = {position[name]: variable_id(name, out) for name, out in self._pairs.items()}
        self._cache_key = metadata.cache_kwarg
        self._with_handle = self._plan_handle_output() if self._pairs else None

    @classmethod
    def _create(cls, program: Any, metadata: ExportMetadata, device: Any = None, **runner_kwargs: Any) -> OpenVINORunner:
        unknown = set(runner_kwargs) - {"config", "torch_threads"}
        if unknown:
            raise TypeError(f"OpenVINORunner takes config and torch_threads as runner options, got {sorted(unknown)}")
        return cls(program, metadata, device=device, **runner_kwargs)

    # --- state --------------------------------------------------------------------------------------------------

    def _sequence(self) -> _Sequence:
        """The calling thread's request and sequence, made on the thread's first call."""
        try:
            return self._local.sequence
        except AttributeError:
            self._local.sequence = _Sequence(self.compiled.create_infer_request())
            return self._local.sequence

    @property
    def request(self) -> Any:
        """The calling thread's ``openvino.InferRequest``."""
        return self._sequence().request

    def reset(self) -> None:
        """Forget the calling thread's carried state: its next call starts a new sequence."""
        sequence = self._sequence()
        sequence.request.reset_state()
        sequence.handle = None
        sequence.beam_idx = None

    def reorder(self, beam_idx: torch.Tensor) -> None:
        """Reorder the carried state along the batch before the next call (beam search): row ``i`` continues from
        row ``beam_idx[i]``; the calling thread's."""
        if not self.stateful:
            raise UnsupportedError("this OpenVINO model is not stateful: reorder the cache tensors you pass instead")
        self._sequence().beam_idx = beam_idx.to(torch.int32)

    def state(self) -> dict[str, torch.Tensor]:
        """The calling thread's live state tensors, by cache leaf name (copies)."""
        by_id = {variable_id(name, out): name for name, out in self._pairs.items()}
        return {by_id[s.name]: torch.from_numpy(np.array(s.state.data, copy=True)) for s in self.request.query_state()
                if s.name in by_id}

    def _load_state(self, request: Any, leaves: list[torch.Tensor]) -> None:
        import openvino as ov

        request.reset_state()
        for variable in request.query_state():
            index = next((i for i, vid in self._state_inputs.items() if vid == variable.name), None)
            if index is not None:
                value = leaves[index]
                if value.dtype == torch.int64:  # stored as int32 (see stateful._narrow_int64_state)
                    value = value.to(torch.int32)
                variable.state = ov.Tensor(np.ascontiguousarray(value.numpy()))

    # --- calling ------------------------------------------------------------------------------------------------

    def run(self, inputs: dict[str, Any], *, share_inputs: bool, share_outputs: bool) -> Any:
        leaves = self.flatten(inputs, copy=False)
        cache = inputs.get(self._cache_key) if self._cache_key else None
        sequence = self._sequence()
        if self._pairs:
            if cache is None or cache is not sequence.handle:
                self._load_state(sequence.request, leaves)  # a new sequence: start from the caller's cache
                sequence.beam_idx = None
            sequence.handle = cache if cache is not None else object()
        outputs = self._infer(sequence, leaves, share_outputs)
        if self._with_handle is not None and cache is not None:
            reduced, start, count = self._with_handle
            user = outputs[len(outputs) - (self._n_user - count):]
            return pytree.tree_unflatten(user[:start] + [cache] + user[start:], reduced)
        return self.unflatten(outputs)

    def flatten(self, inputs: dict[str, Any], copy: bool = False) -> list[torch.Tensor]:
        """As :meth:`ModelRunner.flatten` (caches without their tree context), on the CPU for OpenVINO."""
        return [leaf.detach().cpu() for leaf in self.cast_inputs(self.flat_leaves(inputs), copy)]

    def run_flat(self, inputs: list[torch.Tensor], *, share_outputs: bool) -> list[Any]:
        return self._infer(self._sequence(), inputs, share_outputs)

    def _infer(self, sequence: _Sequence, inputs: list[torch.Tensor], share_outputs: bool) -> list[Any]:
        """Run ``sequence``'s request on flat inputs (``beam_idx`` from its pending reorder); its flat outputs."""
        feed = {}
        for port, index in enumerate(self._fed):
            if index < 0:
                batch = inputs[self._batch_input].shape[0]
                beam = sequence.beam_idx if sequence.beam_idx is not None else torch.arange(batch, dtype=torch.int32)
                sequence.beam_idx = None
                feed[port] = beam.numpy()
            else:
                feed[port] = _numpy(inputs[index])
        request = sequence.request
        request.infer(feed, share_inputs=True)
        outputs = []
        for port in range(len(self.compiled.outputs)):
            data = request.get_output_tensor(port).data
            outputs.append(torch.from_numpy(data if share_outputs else np.array(data, copy=True)))
        return self.checked(outputs)

    def _plan_handle_output(self) -> tuple | None:
        """The output tree with the cache subtree as one leaf (filled with the caller's cache object), the index of
        that leaf among the user outputs, and how many cache leaves it stands for."""
        spec, key = self._out_spec, self._cache_key
        if spec is None or key is None or not isinstance(spec.context, list) or key not in spec.context:
            return None
        if self._out_constants:
            return None
        position = spec.context.index(key)
        children = spec.children()
        start = sum(child.num_leaves for child in children[:position])
        count = children[position].num_leaves
        if count != len(self._pairs):
            raise UnsupportedError(
                f"the cache output {key!r} has {count} tensors but {len(self._pairs)} were folded into state"
            )
        reduced = pytree.TreeSpec(
            spec.type, spec.context, [pytree.treespec_leaf() if i == position else c for i, c in enumerate(children)]
        )
        return reduced, start, count


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    if tensor.dtype == torch.bfloat16:
        raise UnsupportedError("bfloat16 inputs have no numpy type; cast them to float32 or export in float32")
    return tensor.numpy() if tensor.is_contiguous() else np.ascontiguousarray(tensor.numpy())


def _compile(program: Any, device: str, properties: dict[str, Any]) -> Any:
    """``Core.compile_model``; on the CPU, attention over a mask the graph proves purely causal takes the plugin's
    causal flag, where the plugin fuses it with its cache state (:mod:`.causal`; the model as saved otherwise)."""
    import openvino as ov

    core = ov.Core()
    if device == "CPU":
        rewritten, names = use_plugin_causal(program)
        if names:
            compiled = core.compile_model(rewritten, device, properties)
            if fused_with_state(compiled, names):
                logger.info("OpenVINO CPU: %d attention nodes take the plugin's causal flag", len(names))
                return compiled
            logger.info("OpenVINO CPU: the causal rewrite's attention was not fused with its state; kept the mask")
    return core.compile_model(program, device, properties)


def _device_name(device: Any) -> str:
    if device is None:
        return "CPU"
    name = str(device.type if isinstance(device, torch.device) else device)
    return name.upper()
