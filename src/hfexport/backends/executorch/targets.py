"""Where a program is lowered for: one :class:`Target` per ``ExecutorchConfig.backend`` (xnnpack, cuda, mlx).

Each target checks, before anything is traced, that this machine can lower for it and that the inputs suit it, and
builds the partitioners and the edge compile config for ``to_edge_transform_and_lower``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import platform
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ...errors import UnsupportedError
from ...pytrees import is_cache
from .delegable import make_delegable

#: the runtime delegate each ExecutorchConfig.backend lowers to (BackendDetails class names)
DELEGATES = {"xnnpack": "XnnpackBackend", "cuda": "CudaBackend", "mlx": "MLXBackend"}

__all__ = ["Target", "target_for", "DELEGATES"]


@dataclasses.dataclass(frozen=True)
class Target:
    """One ExecuTorch backend: how to check for it and how to partition for it."""

    name: str
    check: Callable[[Any, Mapping[str, Any]], None]
    partitioners: Callable[[Any, Any], list]  # (model, the traced program) -> partitioners
    compile_config: Callable[[], Any]
    transform_passes: Callable[[], Any] = lambda: None
    # rewrites of the traced program, in place, before the edge lowering (so the partitioner takes more of it)
    rewrite: Callable[[Any], Any] = lambda program: None


def _edge_config() -> Any:
    from executorch.exir import EdgeCompileConfig

    # _check_ir_validity stays on: an op outside the core ATen set should fail here, named, not at runtime
    return EdgeCompileConfig(_check_ir_validity=True)


# --- xnnpack ----------------------------------------------------------------------------------------------------------


def _check_xnnpack(model: Any, inputs: Mapping[str, Any]) -> None:
    if importlib.util.find_spec("executorch.backends.xnnpack") is None:
        raise UnsupportedError("this executorch install has no XNNPACK backend (executorch.backends.xnnpack)")
    for name, value in _tensors(inputs):
        if value.device.type != "cpu":
            raise UnsupportedError(f"ExecuTorch XNNPACK runs on the CPU; input {name!r} is on {value.device}")


def _xnnpack_partitioners(model: Any, program: Any) -> list:
    from executorch.backends.xnnpack.partition.config.xnnpack_config import ConfigPrecisionType
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    if not _quantizes_activations_at_run_time(program):
        return [XnnpackPartitioner()]
    # dynamically quantized linears first, each its own partition (as ExecuTorch's LLM export does): grouped with
    # the rest, their run-time choose_qparams nodes made "Invalid partition, found dependency cycles" (SmolLM2,
    # static cache). Only then: on an fp32 graph this per-op partitioner still takes every op whose config has no
    # precision (add, mul, cat, ...), one partition each: 87 delegates instead of 33 for six SmolLM2 layers, and
    # export time grows with the delegates (each is preprocessed and its graph legalised on its own)
    dynamic = XnnpackPartitioner(config_precisions=ConfigPrecisionType.DYNAMIC_QUANT, per_op_mode=True)
    return [dynamic, XnnpackPartitioner()]


def _quantizes_activations_at_run_time(program: Any) -> bool:
    """Whether ``program`` computes activation quantization parameters at run time (a ``choose_qparams`` op: PT2E
    dynamic quantization, torchao's 8da4w)."""
    graph = program.graph_module.graph if hasattr(program, "graph_module") else None
    return graph is None or any(n.op == "call_function" and "choose_qparams" in str(n.target) for n in graph.nodes)


# --- cuda -------------------------------------------------------------------------------------------------------------


def _cuda_missing() -> str | None:
    """Why the ExecuTorch CUDA backend cannot lower here, or None."""
    if importlib.util.find_spec("executorch.backends.cuda") is None:
        return "this executorch install has no CUDA backend (executorch.backends.cuda)"
    if not torch.cuda.is_available():
        return (f"the ExecuTorch CUDA backend compiles its kernels with AOTInductor on a visible GPU, and this torch "
                f"({torch.__version__}) sees none (torch.cuda.is_available() is False)")
    if importlib.util.find_spec("triton") is None:
        return "the ExecuTorch CUDA backend needs triton (pip install triton), which is not installed"
    return None


def _check_cuda(model: Any, inputs: Mapping[str, Any]) -> None:
    reason = _cuda_missing()
    if reason:
        raise UnsupportedError(f"ExecutorchConfig(backend='cuda') cannot lower on this machine: {reason}. "
                               "Use backend='xnnpack' for the CPU.")


def _cuda_partitioners(model: Any, program: Any) -> list:
    from executorch.backends.cuda.cuda_backend import CudaBackend
    from executorch.backends.cuda.cuda_partitioner import CudaPartitioner

    name_spec = CudaBackend.generate_method_name_compile_spec(type(model).__name__)
    return [CudaPartitioner([name_spec, *_cuda_compile_specs(model)])]


def _cuda_compile_specs(model: Any) -> list:
    """The CUDA backend's options for ``model`` (beside the method name)."""
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    if _all_bfloat16(model):
        return []
    # the backend swaps SDPA (and MoE, top-k) for its Triton kernels by default, and its SDPA kernel takes bfloat16
    # only ("Expected bfloat16 inputs" at lowering, seen with executorch 1.5.1 on an H200): a float32 or float16
    # model lowers with AOTInductor's own kernels instead
    return [CompileSpec("triton_kernel_mode", b"OFF")]


def _all_bfloat16(model: Any) -> bool:
    floats = [p.dtype for p in model.parameters() if p.is_floating_point()]
    return bool(floats) and all(d == torch.bfloat16 for d in floats)


# --- mlx --------------------------------------------------------------------------------------------------------------


def _mlx_missing() -> str | None:
    if platform.system() != "Darwin" or platform.machine() != "arm64":
        return f"MLX runs on Apple Silicon (macOS arm64) only; this is {platform.system()} {platform.machine()}"
    if importlib.util.find_spec("executorch.backends.mlx") is None:
        return "this executorch install has no MLX backend (executorch.backends.mlx)"
    return None


def _check_mlx(model: Any, inputs: Mapping[str, Any]) -> None:
    for name, value in inputs.items():
        for cache in _caches(value):
            if type(cache).__name__ == "StaticCache":
                raise UnsupportedError(
                    f"the ExecuTorch MLX backend does not take a StaticCache (input {name!r}); use a DynamicCache "
                    "(GenerationConfig(cache_implementation='dynamic')) with backend='mlx'"
                )
    reason = _mlx_missing()
    if reason:
        raise UnsupportedError(f"ExecutorchConfig(backend='mlx') cannot lower on this machine: {reason}")


def _mlx_partitioners(model: Any, program: Any) -> list:
    from executorch.backends.mlx.partitioner import MLXPartitioner

    return [MLXPartitioner()]


def _mlx_edge_config() -> Any:
    from executorch.exir import EdgeCompileConfig

    return EdgeCompileConfig(_check_ir_validity=False, _skip_dim_order=True)


def _mlx_passes() -> Any:
    from executorch.backends.mlx.passes import get_default_passes

    return get_default_passes()


# --- helpers ----------------------------------------------------------------------------------------------------------


def _tensors(inputs: Mapping[str, Any]):
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            yield name, value


def _caches(value: Any) -> list:
    if not is_cache(value):
        return []
    inner = [getattr(value, n, None) for n in ("self_attention_cache", "cross_attention_cache")]
    return [value, *(c for c in inner if c is not None)]


_TARGETS = {
    "xnnpack": Target("xnnpack", _check_xnnpack, _xnnpack_partitioners, _edge_config, rewrite=make_delegable),
    "cuda": Target("cuda", _check_cuda, _cuda_partitioners, _edge_config),
    "mlx": Target("mlx", _check_mlx, _mlx_partitioners, _mlx_edge_config, _mlx_passes),
}


def target_for(name: str) -> Target:
    """The target for ``ExecutorchConfig.backend`` (the config has already checked it is one of these)."""
    try:
        return _TARGETS[name]
    except KeyError:
        raise UnsupportedError(f"unknown ExecuTorch backend {name!r}; known: {sorted(_TARGETS)}") from None
