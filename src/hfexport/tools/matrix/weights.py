"""A tiny random model's weights brought closer to what a trained network's look like where a random init makes
the outputs degenerate, so the matrix compares an export on values that carry information and on no tie.

Routers: an MoE router the init leaves at zero scores every expert the same (see :func:`seed_zero_routers`).
Batch norms: the RT-DETR family's init draws their weights from ``normal(0, initializer_range)``; each one then
shrinks the activations about 50x, the encoder's output was ~1e-9, every detection score the same number, and
``topk`` picked the queries by tie-breaking, which each runtime does its own way: ONNX, OpenVINO and ExecuTorch
"differed" by 4 while every value before the ``topk`` matched.

Not done (tried): measuring the batch norms' running statistics on the sample inputs. D-FINE, DEIMv2 and
PP-DocLayout keep 300 queries over the 336 tokens of a 128-pixel image, so their ``topk`` reaches the anchors they mask
as invalid, whose scores are all equal, whatever the weights; and at the 1x1 maps of a 32-pixel image the calibrated
network amplifies rounding (run_decompositions alone moved an output by 0.8).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["seed_zero_routers", "lift_vanishing_norms"]


def seed_zero_routers(model: Any) -> None:
    """Random weights for an MoE router (or gate) the model's init leaves at zero (AFMoE's): with every score equal,
    its ``topk`` picks experts by tie-breaking, which each runtime does its own way, and the export is then compared
    on a tie no trained router has (AFMoE's ONNX and OpenVINO logits "differed" by 0.18)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.dim() == 2 and ("router" in name or "gate" in name) and not param.any():
                param.normal_(0.0, 0.02)


def _batch_norms(model: Any) -> list[Any]:
    """PyTorch's batch norms and the detectors' frozen ones (``*FrozenBatchNorm2d``: weight, bias and statistics as
    buffers, D-FINE's HGNetV2 backbone)."""
    return [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
            or (type(m).__name__.endswith("FrozenBatchNorm2d")
                and all(isinstance(getattr(m, k, None), torch.Tensor) for k in ("weight", "running_mean", "running_var")))]


def lift_vanishing_norms(model: Any) -> None:
    """Scale 1 (PyTorch's own default) for the batch norms whose weights the model's init draws near zero (the RT-DETR
    family's ``normal(0, initializer_range)``)."""
    with torch.no_grad():
        for module in _batch_norms(model):
            weight = module.weight
            if isinstance(weight, torch.Tensor) and weight.numel() and float(weight.abs().mean()) < 0.1:
                weight.fill_(1.0)
