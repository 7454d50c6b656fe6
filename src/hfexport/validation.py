"""Parity reports: compare every output leaf of an export with eager PyTorch."""

from __future__ import annotations

from typing import Any

import torch

from .pytrees import get_leaf_tensors

__all__ = ["compare_outputs"]


def compare_outputs(exported: Any, eager: Any) -> dict[str, Any]:
    """Max abs / rel diff per leaf tensor present in both outputs, and the overall max abs diff.

    Example:
        >>> compare_outputs({"a": torch.ones(2)}, {"a": torch.ones(2)})["max_abs_diff"]
        0.0
    """
    got = get_leaf_tensors(exported)
    want = get_leaf_tensors(eager)
    leaves: dict[str, dict[str, Any]] = {}
    problems = []
    for name, ref in want.items():
        if name not in got:
            problems.append(f"{name}: missing from the export's outputs")
            continue
        out = got[name]
        if tuple(out.shape) != tuple(ref.shape):
            problems.append(f"{name}: shape {tuple(out.shape)} != eager {tuple(ref.shape)}")
            continue
        if ref.is_floating_point():
            diff = (out.detach().float().cpu() - ref.detach().float().cpu()).abs()
            abs_diff = float(diff.max()) if diff.numel() else 0.0
            rel = float((diff / ref.detach().float().cpu().abs().clamp_min(1e-6)).max()) if diff.numel() else 0.0
        else:
            abs_diff = float((out.cpu() != ref.cpu()).sum())
            rel = abs_diff
        leaves[name] = {"max_abs_diff": abs_diff, "max_rel_diff": rel, "shape": list(ref.shape)}
    return {
        "max_abs_diff": max((v["max_abs_diff"] for v in leaves.values()), default=0.0),
        "leaves": leaves,
        "problems": problems,
    }
