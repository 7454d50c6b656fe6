"""ExecuTorch / XNNPACK: delegate ``max.dim`` only where XNNPACK's lowering of it accepts the node.

XNNPACK's partitioner (``MaxDimConfig.check_constraints``, executorch backends/xnnpack/partition/config/
node_configs.py) takes any ``max.dim`` on a rank-4 input, but its node visitor (operators/op_max_dim.py) then
requires ``keepdim=True`` and a dim written as 2 or 3, and raises while lowering otherwise: "amax.default only
supports dim == 2 or dim == 3" for an attention-sink or router max over ``dim=-1`` (GPT-OSS, DeepSeek-V4, HY-V4,
MiMo-V2-Flash), "only supports keep_dim == True" for Hiera (seen with executorch 1.5.1). This makes the partitioner
check what the visitor checks, so such a node stays outside the delegate and runs on the portable kernels. No
upstream issue known; drop it once the two agree (or the visitor normalises negative dims).
"""

from __future__ import annotations

from typing import Any

from .registry import Workaround, patch_attribute, register_workaround

__all__ = ["visitor_accepts"]

_MODULE = "executorch.backends.xnnpack.partition.config.node_configs"


def visitor_accepts(node: Any) -> bool:
    """Whether XNNPACK's ``max.dim`` / ``amax`` visitor lowers ``node``: keepdim given and true, dim 2 or 3 as
    written."""
    args = node.args
    dim = args[1] if len(args) > 1 else node.kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
    if isinstance(dim, (list, tuple)):
        dim = dim[0] if len(dim) == 1 else None
    return len(args) == 3 and keepdim is True and dim in (2, 3)


def _apply(model: Any, inputs: dict):
    import importlib

    config = importlib.import_module(_MODULE).MaxDimConfig
    original = config.check_constraints

    def check_constraints(self: Any, node: Any, ep: Any) -> bool:
        return original(self, node, ep) and visitor_accepts(node)

    return patch_attribute(config, "check_constraints", check_constraints)


register_workaround(
    Workaround(
        id="executorch-xnnpack-max-dim",
        backend="executorch",
        target=f"{_MODULE}.MaxDimConfig.check_constraints",
        breaks="a max over dim=-1 (or without keepdim) on a rank-4 input is delegated, then XNNPACK's lowering "
        "raises 'amax.default only supports dim == 2 or dim == 3' / 'only supports keep_dim == True'",
        upstream=None,
        versions={"executorch": ">=1.0,<1.6"},
        apply=_apply,
    )
)
