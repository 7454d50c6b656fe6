"""A tiny random model's weights brought closer to what a trained network's look like where a random init makes
the outputs degenerate, so the matrix compares an export on values that carry information and on no tie.

Routers: an MoE router the init leaves at zero scores every expert the same (see :func:`seed_zero_routers`).
Batch norms: the RT-DETR family's init draws their weights from ``normal(0, initializer_range)``; each one then
shrinks the activations about 50x, the encoder's output was ~1e-9, every detection score the same number, and
``topk`` picked the queries by tie-breaking, which each runtime does its own way: ONNX, OpenVINO and ExecuTorch
"differed" by 4 while every value before the ``topk`` matched.

Convolutions: the same init draws the convolutions' weights from ``normal(0, initializer_range)`` too; each one
then shrinks its input about 5x, and D-FINE's encoder input (after a dozen of them in its HGNetV2 backbone) was ~1e-12
with the norms lifted: 320 of its 336 detection scores fell on 5 values, and ONNX, OpenVINO and ExecuTorch "differed"
by 6.9 on ``init_reference_points`` while every score matched. Such convolutions get a variance-preserving draw
(Kaiming's, gain 1: std 1/sqrt(fan-in)), as a trained network keeps its activations at scale; only in a model that
picks its queries by ``topk`` over its encoder's scores (a module named ``enc_score_head``: RT-DETR, D-FINE, DEIMv2,
PP-DocLayout), so the other models keep their classes' own init (and their rows).

Not done (tried): measuring the batch norms' running statistics on the sample inputs: at the 1x1 maps of a 32-pixel
image the calibrated network amplifies rounding (run_decompositions alone moved an output by 0.8).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["seed_zero_routers", "lift_vanishing_norms", "lift_vanishing_convs"]


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


# a convolution whose weights' std times sqrt(fan-in) is below this shrinks what it reads (1 keeps its scale; with
# sqrt(2), a ReLU network's gain, DEIMv2's decoder amplified ONNX Runtime's rounding to 1.9e-4, with 1 to 1e-5)
_VANISHING_GAIN = 0.5


def lift_vanishing_convs(model: Any, seed: int = 0) -> int:
    """Kaiming's normal draw (fan-in, gain 1; seeded, so every build gives the same weights) for the convolutions
    whose init shrinks their input (gain below 0.5), in a model that picks its queries by ``topk`` over its encoder's
    scores; returns how many."""
    if not any(name.rpartition(".")[2] == "enc_score_head" for name, _ in model.named_modules()):
        return 0
    generator = torch.Generator().manual_seed(seed)
    lifted = 0
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)):
                weight = module.weight
                fan_in = weight[0].numel()
                if weight.numel() > 1 and float(weight.std()) * fan_in**0.5 < _VANISHING_GAIN:
                    torch.nn.init.kaiming_normal_(weight, nonlinearity="linear", generator=generator)
                    lifted += 1
    return lifted
