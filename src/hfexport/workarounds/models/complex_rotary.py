"""OpenVINO, ExecuTorch, ONNX: DeepSeek-V2's and Llama-4's complex rotary embedding, traced with real arithmetic.

Their rotary embedding builds ``torch.polar(ones, freqs)`` (a complex tensor) and ``apply_rotary_emb`` multiplies
``view_as_complex`` pairs of the queries and keys by it, then ``view_as_real``. OpenVINO's PyTorch frontend has no
conversion rule for ``aten.polar`` ("No conversion rule found for operations: aten.polar.default", openvino
2026.3.1), so neither model converts; ExecuTorch's ``to_edge`` refuses it ("Operator torch._ops.aten.polar.default is
not in Core ATen ops"), and torchlib has no complex ``unsqueeze`` ("No ONNX function found for aten.unsqueeze.default",
onnxscript 0.7.0). While tracing for OpenVINO, the rotary embedding returns each position's
``(cos, sin)`` pairs as a real ``[..., dim / 2, 2]`` tensor (scaled as the complex one was) and ``apply_rotary_emb``
rotates each (even, odd) pair with them: ``(a cos - b sin, a sin + b cos)``, the same products as the complex
multiply. Nothing else reads the rotary embedding's output. Llama-4's vision tower keeps its table as a complex
buffer (``Llama4VisionRotaryEmbedding.freqs_ci``) and ``vision_apply_rotary_emb`` multiplies by it the same way:
OpenVINO converted the buffer as real ``[patches, 1, pairs, 2]`` pairs, then refused the complex ``view`` that
broadcasts it ("Requested output shape [1,17,1,8] is incompatible"), and ``to_edge`` refused the complex ops; while
tracing, the buffer is its ``view_as_real`` pairs and the tower rotates with them. Drop each backend's once it
converts ``aten.polar`` and complex multiplication.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch

from ..registry import Workaround, patch_attribute, register_workaround, undo_all

__all__ = ["rotate_pairs"]

# module -> (rotary class, how the (cos, sin) table broadcasts to [batch, heads, seq, pairs] or [batch, seq, heads,
# pairs] queries: the axis the heads take)
_MODELS = {
    "transformers.models.deepseek_v2.modeling_deepseek_v2": ("DeepseekV2RotaryEmbedding", 1),
    "transformers.models.llama4.modeling_llama4": ("Llama4TextRotaryEmbedding", 2),
}


def _real_rotary(self: Any, x: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
    """The rotary table as real ``(cos, sin)`` pairs, ``[batch, seq, dim / 2, 2]``."""
    freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
    return torch.stack([freqs.cos(), freqs.sin()], dim=-1) * self.attention_scaling


def rotate_pairs(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``view_as_real(view_as_complex(x pairs) * complex(table))`` flattened back, with real arithmetic."""
    pairs = x.float().reshape(*x.shape[:-1], -1, 2)
    real, imag = pairs[..., 0], pairs[..., 1]
    cos, sin = table[..., 0], table[..., 1]
    return torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1).flatten(3).type_as(x)


def _real_apply(heads_axis: int) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    def apply_rotary_emb(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> tuple[torch.Tensor, ...]:
        table = freqs_cis.unsqueeze(heads_axis).to(xq.device)
        return rotate_pairs(xq, table), rotate_pairs(xk, table)

    return apply_rotary_emb


_VISION_MODULE, _VISION_ROTARY = "transformers.models.llama4.modeling_llama4", "Llama4VisionRotaryEmbedding"


def _real_vision_apply(query: torch.Tensor, key: torch.Tensor, freqs_ci: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """``vision_apply_rotary_emb`` with the table as real pairs ``[patches, 1, pairs, 2]``; queries and keys are
    ``[batch, patches, heads, head_dim]``."""
    table = freqs_ci.reshape(1, query.shape[1], 1, -1, 2).to(query.device)
    return rotate_pairs(query, table), rotate_pairs(key, table)


def _vision_rotaries(model: Any) -> list[Any]:
    module = sys.modules.get(_VISION_MODULE)
    kind = getattr(module, _VISION_ROTARY, None) if module is not None else None
    if kind is None or not hasattr(model, "modules"):
        return []
    return [m for m in model.modules() if type(m) is kind and torch.is_complex(m.freqs_ci)]


def _modules(model: Any) -> list[tuple[Any, str, int]]:
    found = []
    for name, (rotary, axis) in _MODELS.items():
        module = sys.modules.get(name)
        kind = getattr(module, rotary, None) if module is not None else None
        mine = [m for m in model.modules() if type(m) is kind] if kind is not None and hasattr(model, "modules") else []
        # (a dynamic rope recomputes its frequencies per call: dynamic_rope_update, which the patch leaves out)
        if mine and all(getattr(m, "rope_type", "default") not in ("dynamic", "longrope") for m in mine):
            found.append((module, rotary, axis))
    return found


def _apply(model: Any, inputs: dict):
    undos = []
    for module, rotary, axis in _modules(model):
        undos.append(patch_attribute(getattr(module, rotary), "forward", _real_rotary))
        undos.append(patch_attribute(module, "apply_rotary_emb", _real_apply(axis)))
    vision = _vision_rotaries(model)
    for rotary in vision:  # (a non-persistent buffer: the checkpoint and state dict do not hold it)
        undos.append(patch_attribute(rotary, "freqs_ci", torch.view_as_real(rotary.freqs_ci).contiguous()))
    if vision:
        undos.append(patch_attribute(sys.modules[_VISION_MODULE], "vision_apply_rotary_emb", _real_vision_apply))
    return undo_all(undos)


for _backend, _versions, _breaks, _upstream in (
    ("openvino", {"openvino": ">=2024.0,<2027"},
     "the rotary embedding's torch.polar and complex multiply do not convert: 'No conversion rule found for "
     "operations: aten.polar.default'", "openvino PyTorch frontend (no aten.polar translator in 2026.3.1); no issue known"),
    ("executorch", {"executorch": ">=1.0,<1.6"},
     "to_edge refuses the rotary embedding's complex ops: 'Operator torch._ops.aten.polar.default is not in Core ATen "
     "ops'", "executorch/exir/verification (complex ops are not Core ATen); no issue known"),
    ("onnx", {"onnxscript": "<=0.7.0"},
     "the complex rotary table does not convert: 'No ONNX function found for aten.unsqueeze.default' (complex input)",
     "onnxscript torch_lib (no complex unsqueeze); no issue known"),
):
    register_workaround(Workaround(
        id=f"{_backend}-complex-rotary",
        backend=_backend,
        target="transformers DeepseekV2RotaryEmbedding / Llama4TextRotaryEmbedding and their apply_rotary_emb, "
        "Llama4VisionRotaryEmbedding and vision_apply_rotary_emb",
        breaks=_breaks,
        upstream=_upstream,
        versions=_versions,
        apply=_apply,
        applies=lambda model, inputs: bool(_modules(model) or _vision_rotaries(model)),
    ))
