"""ExecuTorch / XNNPACK: delegate a node only where XNNPACK's lowering of it (its node visitor) accepts it.

XNNPACK's partitioner configs (executorch backends/xnnpack/partition/config/) check less than the node visitors
(backends/xnnpack/operators/) that lower what they took, and a visitor that refuses a node raises while lowering:
the whole export fails where the portable kernels would have run the node. Each workaround here makes one config
check what its visitor checks, so such a node stays outside the delegate. Seen with executorch 1.5.1; no upstream
issue known; drop one once its config and visitor agree.

- ``executorch-xnnpack-max-dim``: ``MaxDimConfig`` takes any ``max.dim`` on a rank-4 input, but op_max_dim.py
  requires ``keepdim=True`` and a dim written as 2 or 3: "amax.default only supports dim == 2 or dim == 3" for an
  attention-sink or router max over ``dim=-1`` (GPT-OSS, DeepSeek-V4, HY-V4, MiMo-V2-Flash), "only supports
  keep_dim == True" for Hiera.
- ``executorch-xnnpack-unsqueeze-dynamic``: ``UnsqueezeCopyConfig`` takes a trailing ``unsqueeze``, but
  op_squeeze.py lowers it to a static reshape that allows one dynamic dim: "XNNPACK reshape only supports 1 dynamic
  dimension" for a rotate-half ``stack(..., dim=-1)`` (Cohere, Cohere2, ERNIE 4.5) or an SSM's reshapes (Mamba2,
  Parakeet) once batch and sequence length are both dynamic.
- ``executorch-xnnpack-conv1d-dynamic``: ``ConvolutionConfig`` takes a 1-D convolution, which XNNPACK runs as a 2-D
  one between an ``unsqueeze`` and a ``squeeze`` its own pass inserts (``Conv1dUnsqueezePass``), past the unsqueeze
  config's check: with batch and frames both dynamic the same "XNNPACK reshape only supports 1 dynamic dimension"
  (the audio encoders' convolutional front ends: Moonshine, Speech2Text, SpeechT5, Parakeet, Canary, Cohere ASR).
- ``executorch-xnnpack-batchnorm1d-dynamic``: ``BatchNormConfig`` takes a ``BatchNorm1d`` it cannot fuse into a
  delegated convolution, which its ``DecomposeBatchNorm`` pass rewrites as a 1-D convolution, lowered as above: the
  same error for the conformer convolution module's norm (Parakeet, Canary, Cohere ASR) once the convolution before
  it stays outside by the previous workaround.
- ``executorch-xnnpack-max-rank``: no config checks a tensor's rank, and XNNPACK defines tensors of at most 6 dims
  (``XNN_MAX_TENSOR_DIMS``): a patch grid's rank-8 ``permute`` / ``clone`` was delegated and the method failed to
  load ("Failed to define tensor 0 with code: xnn_status_unsupported_parameter", error 0x1: Inkling's vision
  patches). The configs' common check (``XNNPartitionerConfig.check_common_constraints``) also requires every
  tensor the node takes or makes to have at most 6 dims.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from .registry import Workaround, patch_attribute, register_workaround

__all__ = ["max_dim_visitor_accepts", "reshape_visitor_accepts", "conv1d_visitor_accepts", "rank_within_xnnpack"]

_MODULE = "executorch.backends.xnnpack.partition.config"
_GEMM = "executorch.backends.xnnpack.partition.config.gemm_configs"
_NODE = "executorch.backends.xnnpack.partition.config.node_configs"
_BASE = "executorch.backends.xnnpack.partition.config.xnnpack_config"
_MAX_RANK = 6  # XNN_MAX_TENSOR_DIMS (xnnpack include/xnnpack.h)


def max_dim_visitor_accepts(node: Any) -> bool:
    """Whether XNNPACK's ``max.dim`` / ``amax`` visitor lowers ``node``: keepdim given and true, dim 2 or 3 as
    written."""
    args = node.args
    dim = args[1] if len(args) > 1 else node.kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
    if isinstance(dim, (list, tuple)):
        dim = dim[0] if len(dim) == 1 else None
    return len(args) == 3 and keepdim is True and dim in (2, 3)


def reshape_visitor_accepts(node: Any) -> bool:
    """Whether XNNPACK's static reshape (the lowering of ``unsqueeze_copy``) takes ``node``'s output: at most one
    of its dims symbolic."""
    value = node.meta.get("val")
    if value is None:
        return False
    return sum(1 for size in value.shape if not isinstance(size, int)) <= 1


def conv1d_visitor_accepts(node: Any) -> bool:
    """Whether XNNPACK lowers ``node`` (a convolution, or a batch norm it makes one) without a reshape of two dynamic
    dims: a 2-D or 3-D convolution, or a 1-D one whose input has at most one symbolic dim."""
    source = node.args[0] if node.args else None
    value = source.meta.get("val") if hasattr(source, "meta") else None
    if value is None or value.dim() != 3:
        return True
    return sum(1 for size in value.shape if not isinstance(size, int)) <= 1


def rank_within_xnnpack(node: Any) -> bool:
    """Whether every tensor ``node`` takes or makes has at most the 6 dims XNNPACK can define."""
    import torch

    values = [node.meta.get("val")] + [arg.meta.get("val") for arg in node.all_input_nodes]
    flat = [v for value in values for v in (value if isinstance(value, (list, tuple)) else [value])]
    return all(v.dim() <= _MAX_RANK for v in flat if isinstance(v, torch.Tensor))


def _narrowing(config_name: str, accepts: Callable[[Any], bool], module: str = _MODULE,
               method: str = "check_constraints") -> Callable[[Any, dict], Callable[[], None]]:
    """A workaround's ``apply``: ``module.config_name.<method>`` (a node check) also requires ``accepts(node)``."""

    def apply(model: Any, inputs: dict):
        config = getattr(importlib.import_module(module), config_name)
        original = getattr(config, method)

        def check(self: Any, node: Any, ep: Any) -> bool:
            return original(self, node, ep) and accepts(node)

        return patch_attribute(config, method, check)

    return apply


for _id, _config, _accepts, _breaks, _module, _method in (
    ("executorch-xnnpack-max-dim", "MaxDimConfig", max_dim_visitor_accepts,
     "a max over dim=-1 (or without keepdim) on a rank-4 input is delegated, then XNNPACK's lowering raises "
     "'amax.default only supports dim == 2 or dim == 3' / 'only supports keep_dim == True'", _MODULE,
     "check_constraints"),
    ("executorch-xnnpack-unsqueeze-dynamic", "UnsqueezeCopyConfig", reshape_visitor_accepts,
     "a trailing unsqueeze whose output has two dynamic dims (batch and length) is delegated, then XNNPACK's "
     "lowering raises 'XNNPACK reshape only supports 1 dynamic dimension'", _MODULE, "check_constraints"),
    ("executorch-xnnpack-conv1d-dynamic", "ConvolutionConfig", conv1d_visitor_accepts,
     "a 1-D convolution over a batch and frames both dynamic is delegated, then XNNPACK's lowering of the unsqueeze "
     "its own pass puts around it raises 'XNNPACK reshape only supports 1 dynamic dimension'", _GEMM,
     "check_constraints"),
    ("executorch-xnnpack-batchnorm1d-dynamic", "BatchNormConfig", conv1d_visitor_accepts,
     "a BatchNorm1d over a batch and frames both dynamic is delegated and decomposed into a 1-D convolution, then "
     "XNNPACK's lowering raises 'XNNPACK reshape only supports 1 dynamic dimension'", _NODE, "check_constraints"),
    ("executorch-xnnpack-max-rank", "XNNPartitionerConfig", rank_within_xnnpack,
     "a node over a tensor of more than 6 dims (a patch grid's permute) is delegated, then the method fails to load: "
     "'Failed to define tensor 0 with code: xnn_status_unsupported_parameter' (error 0x1)", _BASE,
     "check_common_constraints"),
):
    register_workaround(Workaround(
        id=_id,
        backend="executorch",
        target=f"{_module}.{_config}.{_method}",
        breaks=_breaks,
        upstream=None,
        versions={"executorch": ">=1.0,<1.6"},
        apply=_narrowing(_config, _accepts, _module, _method),
    ))
