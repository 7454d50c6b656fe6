"""``DynamoRunner``: runs an ``ExportedProgram`` through its ``module()``; mutations land in the caller's tensors."""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch
import torch.utils._pytree as pytree

from ...configs import ExportFormat
from ...errors import UnsupportedError
from ...metadata import ExportMetadata
from ...pytrees import is_cache, tensor_leaves
from ...runner import COUNT_HINT, ModelRunner, torch_dtype

__all__ = ["DynamoRunner"]


class DynamoRunner(ModelRunner):
    """Runs an ``ExportedProgram``. A ``USER_INPUT_MUTATION`` (a static cache write) updates the caller's tensors."""

    export_format = ExportFormat.DYNAMO
    computes_with_torch = True

    def __init__(self, program: torch.export.ExportedProgram, metadata: ExportMetadata, device: Any = None):
        super().__init__(metadata)
        if device is not None and str(torch.device(device)) != (metadata.export_device or "cpu"):
            from torch.export.passes import move_to_device_pass

            program = move_to_device_pass(program, torch.device(device))
        self.program = program
        self.device = torch.device(device) if device is not None else None
        self._module = program.module()
        self._top_dtypes = {
            s.name: torch_dtype(s.dtype) for s in metadata.inputs if s.name in metadata.kwargs
        }
        # the tensors of a dict kwarg (one attention mask per layer type): ``attention_mask.full_attention``
        self._dict_dtypes: dict[str, dict[str, torch.dtype]] = {}
        for s in metadata.inputs:
            top, _, key = s.name.partition(".")
            if key and "." not in key and s.cache is None and top in metadata.kwargs:
                self._dict_dtypes.setdefault(top, {})[key] = torch_dtype(s.dtype)

    @property
    def output_device(self) -> torch.device:
        return self.device or torch.device(self.metadata.export_device or "cpu")

    @classmethod
    def _create(cls, program: Any, metadata: ExportMetadata, device: Any = None, **runner_kwargs: Any) -> DynamoRunner:
        if runner_kwargs:
            raise TypeError(f"DynamoRunner takes no runner options, got {sorted(runner_kwargs)}")
        return cls(program, metadata, device=device)

    def run(self, inputs: dict[str, Any], *, share_inputs: bool, share_outputs: bool) -> Any:
        call = {}
        for key, value in inputs.items():
            if isinstance(value, torch.Tensor):
                dtype = self._top_dtypes.get(key)
                if dtype is not None and value.dtype != dtype:
                    value = self.cast_leaf(value, key, dtype)
                elif not share_inputs:
                    value = value.clone()
                if self.device is not None and value.device != self.device:
                    value = value.to(self.device)
            elif type(value) is dict and key in self._dict_dtypes:  # (a ModelOutput stays as it is)
                dtypes = self._dict_dtypes[key]
                if any(isinstance(v, torch.Tensor) and k in dtypes and v.dtype != dtypes[k] for k, v in value.items()):
                    value = {k: self.cast_leaf(v, f"{key}.{k}", dtypes[k])
                             if isinstance(v, torch.Tensor) and k in dtypes and v.dtype != dtypes[k] else v
                             for k, v in value.items()}
            elif not share_inputs and is_cache(value):
                value = copy.deepcopy(value)
            call[key] = value
        try:
            with torch.no_grad():
                return self._module(**call)
        except ValueError as e:
            if "tree spec" not in str(e):
                raise
            rebound = self._rebind_caches(call, e)
            with torch.no_grad():
                return self._module(**rebound)
        except (AssertionError, RuntimeError) as e:
            if "Runtime assertion failed for expression" in str(e):  # (capture.trace: a branch taken on the sample)
                raise UnsupportedError(
                    f"these inputs take another branch of {self.metadata.architecture}'s data-dependent code than the "
                    f"sample it was traced with, which the export assumed ({str(e).splitlines()[0]}): re-export with "
                    "sample inputs that take the branch you run, or export that branch as its own graph"
                ) from e
            if "Guard failed" not in str(e) and "Expected input" not in str(e):
                raise
            shapes = {k: tuple(v.shape) for k, v in call.items() if isinstance(v, torch.Tensor)}
            traced = {s.name: s.shape for s in self.metadata.inputs if s.name in self._top_dtypes}
            counts = [k for k, v in traced.items() if "grid" in k and v and isinstance(v[0], int)
                      and k in shapes and shapes[k][0] != v[0]]
            hint = f" ({', '.join(counts)}{COUNT_HINT})" if counts else ""
            raise UnsupportedError(
                f"inputs {shapes} are outside the shapes this export accepts ({e}). It was traced with shapes "
                f"{traced} (ints are sizes the model's code fixed while tracing). Re-export with sample inputs shaped "
                f"like the ones you run; for sliding-window models trace a sequence longer than the window.{hint}"
            ) from e

    @functools.cached_property
    def _traced_specs(self) -> dict[str, pytree.TreeSpec]:
        """Each traced kwarg's pytree spec, parsed once (a caller's own cache is rebound at every step)."""
        return self.metadata.kwarg_specs()

    def _rebind_caches(self, call: dict[str, Any], error: ValueError) -> dict[str, Any]:
        """Put each cache's tensors into the traced cache's structure, when only plain attributes differ.

        torch.export compares a cache's whole pytree context, so a ``StaticCache`` made for batch 3 does not match
        one traced at batch 2 (the context records ``batch_size``) even where the graph's batch dimension is dynamic
        and its guards accept the tensors. The tensors themselves are kept (not copied), so in-place cache writes
        still land in the caller's cache. A cache with another number of tensors cannot be rebound: a clear error.
        """
        rebound = dict(call)
        for key, value in call.items():
            traced = self._traced_specs.get(key)
            if not is_cache(value) or traced is None:
                continue
            leaves = tensor_leaves(value)
            if len(leaves) != traced.num_leaves and self.initialize_lazy_caches(call):
                leaves = tensor_leaves(value)
            if len(leaves) != traced.num_leaves:
                raise UnsupportedError(
                    f"{key} ({type(value).__name__}) flattens to {len(leaves)} tensors but this export's cache takes "
                    f"{traced.num_leaves}: pass a cache shaped like the traced one (initialized, same number of "
                    "layers and the same cache class), or let ExportedModel.generate() build it. A static cache "
                    "allocates its tensors on its first update, so a fresh StaticCache has none yet."
                ) from error
            rebound[key] = pytree.tree_unflatten(leaves, traced)
        if rebound.keys() == call.keys() and all(rebound[k] is call[k] for k in call):
            raise UnsupportedError(
                f"the inputs do not have the structure this export was traced with ({error}); pass the same keyword "
                "arguments and cache class as the sample inputs"
            ) from error
        return rebound
