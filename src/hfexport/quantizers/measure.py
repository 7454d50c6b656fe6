"""What a quantized export costs and keeps: weight bytes on disk, and greedy top-1 agreement with eager PyTorch.

- :func:`weight_bytes`: the bytes an export's saved folder spends on weights (``.pt2`` weight/constant entries,
  ONNX initializers and tensor constants, the OpenVINO ``.bin``, the whole ``.pte``), read from the files.
- :func:`top1_agreement`: eager greedy-decodes ``steps`` tokens; the export is then run teacher-forced on eager's
  tokens, and each step scores whether its argmax is eager's token.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["weight_bytes", "fp32_weight_bytes", "top1_agreement", "eager_greedy"]


def fp32_weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers at fp32, each shared tensor counted once."""
    seen, total = set(), 0
    for tensor in (*model.parameters(), *model.buffers()):
        if tensor.data_ptr() in seen or not tensor.is_floating_point():
            continue
        seen.add(tensor.data_ptr())
        total += tensor.numel() * 4
    return total


def weight_bytes(folder: str | Path) -> int:
    """The bytes a saved export's files spend on weights, read from disk; a tensor several graphs share (ONNX
    external data, one ``.bin`` per program) is counted once."""
    folder = Path(folder)
    total = 0
    external: set[tuple[str, int, int]] = set()
    for path in sorted(folder.rglob("*")):
        if path.suffix == ".pt2":
            with zipfile.ZipFile(path) as archive:
                total += sum(
                    i.file_size for i in archive.infolist()
                    if "/data/" in i.filename and not i.filename.endswith(".json")
                )
        elif path.suffix == ".onnx":
            total += _onnx_tensor_bytes(path, external)
        elif path.suffix in (".bin", ".pte"):
            total += path.stat().st_size
    return total


def _onnx_tensor_bytes(path: Path, external: set[tuple[str, int, int]]) -> int:
    import onnx_ir as ir

    model = ir.load(path)
    tensors = [v.const_value for v in model.graph.initializers.values() if v.const_value is not None]
    for graph in model.graphs():
        for node in graph:
            tensors += [a.value for a in node.attributes.values() if a.type == ir.AttributeType.TENSOR]
    total = 0
    for tensor in tensors:
        if isinstance(tensor, ir.ExternalTensor):
            key = (tensor.location, tensor.offset or 0, tensor.length or 0)
            if key in external:
                continue
            external.add(key)
        total += tensor.nbytes
    return total


def eager_greedy(model: torch.nn.Module, input_ids: torch.Tensor, steps: int) -> torch.Tensor:
    """Eager greedy continuation: the prompt followed by ``steps`` tokens (no early stop at EOS)."""
    with torch.no_grad():
        return model.generate(
            input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=steps,
            min_new_tokens=steps, do_sample=False, num_beams=1,
        )


def top1_agreement(exported: Any, sequence: torch.Tensor, prompt_len: int) -> float:
    """Share of the decode steps (teacher-forced on eager's greedy ``sequence``) where the export's argmax is eager's
    next token.

    ``exported`` is a single-graph export, or an ``export_for_generation`` result with a dynamic cache (its prefill
    graph): one forward over the whole sequence, where the causal mask makes each position a decode step on eager's
    tokens.
    """
    target = sequence[:, prompt_len:]
    if "decode" not in getattr(exported, "components", {}):
        inputs = sequence[:, :-1]
        logits = exported(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits
        predicted = logits[:, prompt_len - 1 :].argmax(-1)
    else:
        predicted = _stepwise(exported, sequence, prompt_len)
    return float((predicted == target).float().mean())


def _stepwise(exported: Any, sequence: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The export's prefill graph over eager's whole sequence, on an empty cache: with the causal mask, each
    position is one decode step teacher-forced on eager's tokens (the decode graph picks its own tokens in
    ``generate``, so it cannot be teacher-forced from outside)."""
    from ..generation import TextState, _Component

    component = _Component(exported, "prefill")
    inputs = sequence[:, :-1]
    state = TextState(torch.ones_like(inputs), 0, None, None)
    call = state.kwargs(component, 0, inputs.shape[1], component.initial_cache(inputs.shape[0]))
    call["input_ids"] = inputs
    logits = component.runner(**call).logits
    return logits[:, prompt_len - 1 :].argmax(-1)
