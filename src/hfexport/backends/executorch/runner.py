"""``ExecutorchRunner``: runs a ``.pte``'s ``forward`` method on the ExecuTorch runtime (``executorch.runtime``).

Inputs are flattened through the typed signature (caches by their tensor leaves). The Python runtime cannot bind an
output onto an input's buffer (``Method::set_output_data_ptr`` is C++ only), so a cache the program updates comes
back among the method's outputs at every step; the runner writes it back into the caller's cache tensors, so the
call updates the caller's cache as eager PyTorch does, and returns that cache object.
"""

from __future__ import annotations

from typing import Any

import torch

from ...configs import ExportFormat
from ...errors import UnsupportedError
from ...metadata import ExportMetadata, IORole
from ...runner import ModelRunner

__all__ = ["ExecutorchRunner", "runtime_program"]


def runtime_program(program: Any) -> Any:
    """The ``executorch.runtime.Program`` of an exported ``ExecutorchProgramManager`` (loaded once per manager and
    kept on it) or of a program :meth:`ExecutorchExporter.load_program` read back."""
    from executorch.runtime import Program, Runtime

    if isinstance(program, Program):
        return program
    loaded = getattr(program, "_hfexport_runtime_program", None)
    if loaded is None:
        loaded = Runtime.get().load_program(program.buffer)
        program._hfexport_runtime_program = loaded
    return loaded


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
        self.program = program
        self.method_name = method
        self.method = runtime_program(program).load_method(method)
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

    @classmethod
    def _create(cls, program: Any, metadata: ExportMetadata, device: Any = None, **runner_kwargs: Any):
        unknown = set(runner_kwargs) - {"method"}
        if unknown:
            raise TypeError(f"ExecutorchRunner takes method as its runner option, got {sorted(unknown)}")
        return cls(program, metadata, device=device, **runner_kwargs)

    def run_flat(self, inputs: list[torch.Tensor], *, share_outputs: bool) -> list[Any]:
        feed = [t if t.is_contiguous() else t.contiguous() for t in inputs]
        # a constant output (None, an int) comes back as its value; the metadata keeps it in out_constants
        outputs = [o for o in self.method.execute(feed) if isinstance(o, torch.Tensor)]
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
        return outputs
