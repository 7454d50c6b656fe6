"""A PT2E annotator for int8 weight-only layers: the linear layers whose activations stay in float, and embeddings.

Composed before an activation quantizer (``ComposableQuantizer([WeightOnlyInt8Quantizer(...), x86])``), it claims
its nodes first; ``X86InductorQuantizer`` and ``XNNPACKQuantizer`` skip a node that is already annotated. Weights
are symmetric int8 with one scale per output channel (per row of an embedding table), so they lower to
``dequantize_per_channel`` before a float ``linear`` / ``embedding``, which every backend takes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch

from .fxgraph import module_path

__all__ = ["WeightOnlyInt8Quantizer"]


def _weight_spec() -> Any:
    from torchao.quantization.pt2e.observer import PerChannelMinMaxObserver
    from torchao.quantization.pt2e.quantizer import QuantizationSpec

    return QuantizationSpec(
        dtype=torch.int8, quant_min=-127, quant_max=127, qscheme=torch.per_channel_symmetric, ch_axis=0,
        is_dynamic=False, observer_or_fake_quant_ctr=PerChannelMinMaxObserver.with_args(eps=2**-12),
    )


def _base() -> type:
    from torchao.quantization.pt2e.quantizer import Quantizer

    return Quantizer


class WeightOnlyInt8Quantizer(_base()):  # type: ignore[misc]  # torchao is imported when this module is
    """Annotate int8 per-channel weights (activations left float) of the ``linear`` nodes whose module path matches
    one of ``modules`` (regular expressions, ``re.search``) and, with ``embeddings``, of every ``embedding``.

    Example:
        >>> ComposableQuantizer([WeightOnlyInt8Quantizer([r"\\.mlp\\.down_proj$"]), x86_quantizer])
    """

    def __init__(self, modules: Iterable[str] = (), embeddings: bool = True):
        super().__init__()
        self.modules = [re.compile(p) for p in modules]
        self.embeddings = embeddings

    def annotate(self, model: torch.fx.GraphModule) -> torch.fx.GraphModule:
        from torchao.quantization.pt2e.quantizer import QuantizationAnnotation
        from torchao.quantization.pt2e.quantizer.quantizer import Q_ANNOTATION_KEY

        spec = _weight_spec()
        for node in model.graph.nodes:
            if node.op != "call_function" or Q_ANNOTATION_KEY in node.meta:
                continue
            if node.target == torch.ops.aten.linear.default:
                path = module_path(node)
                if not path or not any(p.search(path) for p in self.modules):
                    continue
                weight = node.args[1]
            elif node.target == torch.ops.aten.embedding.default and self.embeddings:
                weight = node.args[0]
            else:
                continue
            node.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(input_qspec_map={weight: spec}, _annotated=True)
        return model

    def validate(self, model: torch.fx.GraphModule) -> None:
        pass
