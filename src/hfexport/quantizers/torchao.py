"""``TorchAOQuantizer``: torchao's ``quantize_`` on a copy of the eager module, before ``torch.export`` traces it.

This is how ExecuTorch's own LLM export quantizes (``executorch.extension.llm.export.quantize``): the linear layers'
weights become torchao tensor subclasses (``IntxUnpackedToInt8Tensor``: int8 storage of 4-bit values, a scale per
group of 32), whose ``torchao.choose_qparams_affine`` / ``quantize_affine`` / ``dequantize_affine`` ops the trace
records around each ``linear``. XNNPACK's partitioner takes that pattern (int8 dynamic per-token activations, 4-bit
grouped weights) into its delegate as a ``qd8-f32-qb4w`` fully-connected, the weights packed to 4 bits with bf16
scales. An embedding given a weight-only config (``IntxWeightOnlyConfig``) traces as ``dequantize_affine`` +
``embedding``, which ExecuTorch's quant fusion pass rewrites into ``quantized_decomposed::embedding_byte`` /
``embedding_4bit`` (its quantized kernels, outside the delegate; see the ExecuTorch backend's lowering).
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..configs import ExportFormat
from .base import ExportQuantizer

__all__ = ["TorchAOQuantizer"]

logger = logging.getLogger(__name__)

#: ``filter_fn(module, fqn) -> bool``, as ``torchao.quantization.quantize_`` takes it
FilterFn = Callable[[torch.nn.Module, str], bool]


class TorchAOQuantizer(ExportQuantizer):
    """Quantize the eager module with torchao's ``quantize_`` before the trace (ExecuTorch only).

    The user's model is never changed: each graph an export traces (the model, or each generation component) is
    deep-copied and the copy quantized. Data-free: no calibration.

    Args:
        config: The torchao config (an ``AOBaseConfig``) of the linear layers, e.g.
            ``Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32))``.
        filter_fn: Which modules get ``config`` (``(module, fqn) -> bool``). Default: every ``nn.Linear`` whose
            input width is a multiple of the config's group size (a layer that is not stays float, logged).
        module_configs: Regular expressions (``re.search``) over module paths -> the config of the linears they
            match instead of ``config``, or ``None`` to keep them float (``{r"(^|\\.)lm_head$": int8_config}``).
            The first matching pattern wins.
        embedding_config: A weight-only config (``IntxWeightOnlyConfig``) for the ``nn.Embedding`` layers; ``None``
            (the default) keeps them float. A weight tied to a quantized layer is untied: each gets its own copy.
        float_zero_points: The linears whose config is int8-dynamic-activation x int4-weight in groups get HQQ's
            codes, scales and float zero points: the symmetric codes in torchao's tensor (XNNPACK's 4-bit kernel
            takes no zero point) and each group's float offset as a small float product of the input's group sums
            (:mod:`~hfexport.quantizers.torchao_offsets`), the module wrapped in a ``GroupOffsetLinear``.

    Example:
        >>> from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup
        >>> quantizer = TorchAOQuantizer(
        ...     Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32)))
        >>> ExecutorchConfig(quantizer=quantizer)
    """

    quantizes_module = True
    supported_formats = (ExportFormat.EXECUTORCH,)
    required_packages = {"torchao": "0.14"}

    def __init__(
        self,
        config: Any,
        filter_fn: FilterFn | None = None,
        *,
        module_configs: Mapping[str, Any] | None = None,
        embedding_config: Any = None,
        float_zero_points: bool = False,
    ):
        super().__init__(None)
        if config is None or not hasattr(config, "__dataclass_fields__"):
            raise TypeError(
                "TorchAOQuantizer takes a torchao quantization config (Int8DynamicActivationIntxWeightConfig, "
                f"IntxWeightOnlyConfig, ...), got {type(config).__name__}"
            )
        self.config = config
        self.filter_fn = filter_fn
        self.module_configs = dict(module_configs or {})
        self.embedding_config = embedding_config
        self.float_zero_points = float_zero_points

    def unsupported_hint(self, export_format: ExportFormat | str) -> str:
        return (
            " (its tensor-subclass ops lower to XNNPACK's kernels only); for int4 weights use the 'ort-int4' recipe "
            "on ONNX, 'nncf-int4' on OpenVINO or Dynamo, and 'pt2e-int8' for int8 on Dynamo"
        )

    def with_calibration(self, calibration_dataset: Any) -> ExportQuantizer:
        return self  # data-free: calibration prompts (the CLI's --calibration) change nothing

    def plan(self, module: torch.nn.Module) -> dict[str, Any]:
        """Which config each quantized module of ``module`` gets: ``{module path: config}`` (the embeddings, then
        the linears; the layers left float are absent)."""
        out: dict[str, Any] = {}
        patterns = [(re.compile(p), c) for p, c in self.module_configs.items()]
        for fqn, child in module.named_modules():
            if isinstance(child, torch.nn.Embedding):
                if self.embedding_config is not None and _fits(child, self.embedding_config, fqn):
                    out[fqn] = self.embedding_config
                continue
            chosen = next((c for p, c in patterns if p.search(fqn)), self.config)
            if chosen is None:
                continue
            selected = self.filter_fn(child, fqn) if self.filter_fn is not None else isinstance(child, torch.nn.Linear)
            if selected and (self.filter_fn is not None or _fits(child, chosen, fqn)):
                out[fqn] = chosen
        return out

    def quantize_module(
        self, module: torch.nn.Module, sample_inputs: dict[str, Any], export_format: ExportFormat
    ) -> torch.nn.Module:
        from torchao.quantization import quantize_

        quantized = copy.deepcopy(module)
        plan = self.plan(quantized)
        if self.float_zero_points:
            plan = self._split_float_zero_points(quantized, plan)
        # one quantize_ call per distinct config, each over the modules planned for it
        for config in {id(c): c for c in plan.values()}.values():
            with torch.no_grad():
                quantize_(quantized, config, filter_fn=lambda m, fqn, c=config: plan.get(fqn) is c)
        counts: dict[str, int] = {}
        for config in plan.values():
            counts[_describe(config)] = counts.get(_describe(config), 0) + 1
        logger.info("torchao: %s", ", ".join(f"{n} layers {name}" for name, n in counts.items()) or "no layer")
        return quantized

    @staticmethod
    def _split_float_zero_points(module: torch.nn.Module, plan: dict[str, Any]) -> dict[str, Any]:
        """The planned int4 linears quantized with HQQ's float zero points split off (torchao_offsets), in place;
        the plan of the modules left to ``quantize_``."""
        from .torchao_offsets import split_float_zero_points, takes_float_zero_points

        left = {}
        for fqn, config in plan.items():
            if not takes_float_zero_points(config):
                left[fqn] = config
                continue
            parent_name, _, name = fqn.rpartition(".")
            parent = module.get_submodule(parent_name)
            with torch.no_grad():
                setattr(parent, name, split_float_zero_points(getattr(parent, name), config))
        logger.info("torchao: %d int4 layers with HQQ float zero points split off", len(plan) - len(left))
        return left

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": type(self).__name__, "calibrated": False, "config": _describe(self.config)}
        if self.module_configs:
            out["module_configs"] = {p: None if c is None else _describe(c) for p, c in self.module_configs.items()}
        if self.embedding_config is not None:
            out["embedding_config"] = _describe(self.embedding_config)
        if self.float_zero_points:
            out["float_zero_points"] = True
        if self.filter_fn is not None:
            out["filter_fn"] = getattr(self.filter_fn, "__qualname__", repr(self.filter_fn))
        return out

    def __repr__(self) -> str:
        return f"TorchAOQuantizer({_describe(self.config)})"


def _group_size(config: Any) -> int | None:
    """The group size of a torchao config's weights (``PerGroup``), or ``None`` (per channel / per tensor)."""
    granularity = getattr(config, "weight_granularity", None) or getattr(config, "granularity", None)
    return getattr(granularity, "group_size", None)


def _fits(module: torch.nn.Module, config: Any, fqn: str) -> bool:
    """Whether ``module``'s weight splits into the config's groups (its input width a multiple of the size)."""
    weight = getattr(module, "weight", None)
    group = _group_size(config)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        return False
    if group is not None and weight.shape[-1] % group:
        logger.info("torchao: %s stays float: its input width %d is not a multiple of the group size %d",
                    fqn, weight.shape[-1], group)
        return False
    return True


def _describe(config: Any) -> str:
    """A short description of a torchao config: its class and the fields that say what it stores."""
    fields = []
    for name in ("weight_dtype", "weight_granularity", "granularity", "intx_choose_qparams_algorithm"):
        value = getattr(config, name, None)
        if value is not None:
            fields.append(f"{name}={getattr(value, 'value', value)}")
    return f"{type(config).__name__}({', '.join(fields)})"
