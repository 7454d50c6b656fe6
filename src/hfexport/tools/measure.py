"""What a quantized export costs and keeps: weight bytes on disk, and greedy top-1 agreement with eager PyTorch.

- :func:`weight_bytes`: the bytes an export's saved folder spends on weights (``.pt2`` weight/constant entries,
  ONNX initializers and tensor constants, the OpenVINO ``.bin``, the whole ``.pte`` and its ``.ptd`` data file, a
  Dynamo export's ``shared_weights.safetensors``), read from the files.
- :func:`top1_agreement`: eager greedy-decodes ``steps`` tokens; the export is then run teacher-forced on eager's
  tokens (a generation export through its own prefill and decode graphs), and each step scores whether its argmax is
  eager's token.
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
        elif path.suffix in (".bin", ".pte", ".ptd", ".safetensors"):
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
    """Eager greedy continuation: the prompt followed by ``steps`` argmax tokens, EOS included like any other token.

    A loop of its own over a ``DynamicCache`` rather than ``model.generate``: generate cannot run past EOS without
    ``min_new_tokens``, whose logits processor masks EOS, so the "greedy" token at such a step is not the argmax the
    export is scored against (measured: the tiny Llama's step 44, EOS 0.474 vs 0.432).
    """
    from transformers import DynamicCache

    sequence = input_ids
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        new = input_ids
        for _ in range(steps):
            out = model(input_ids=new, attention_mask=torch.ones_like(sequence), past_key_values=cache, use_cache=True)
            new = out.logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, new], dim=-1)
    return sequence


def top1_agreement(exported: Any, sequence: torch.Tensor, prompt_len: int) -> float:
    """Share of the decode steps (teacher-forced on eager's greedy ``sequence``) where the export's argmax is eager's
    next token.

    ``exported`` is a single-graph export: one forward over the whole sequence, where the causal mask makes each
    position a decode step on eager's tokens; or an ``export_for_generation`` result: its prefill graph on the prompt,
    then its decode graph once per step, each fed eager's token (the cache the export wrote itself), as ``generate``
    runs it.
    """
    target = sequence[:, prompt_len:]
    if "decode" not in getattr(exported, "components", {}):
        inputs = sequence[:, :-1]
        logits = exported(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits
        predicted = logits[:, prompt_len - 1 :].argmax(-1)
    else:
        predicted = _forced_decode(exported, sequence, prompt_len)
    return float((predicted == target).float().mean())


def _forced_decode(exported: Any, sequence: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """The export's own prefill + decode loop, each decode step fed eager's token instead of the export's pick."""
    from ..generation.decoder import decoder_session

    steps = sequence.shape[1] - prompt_len
    prompt = sequence[:, :prompt_len]
    _, logits, step = decoder_session(exported, {"input_ids": prompt, "attention_mask": torch.ones_like(prompt)},
                                      steps)
    predicted = [logits[:, -1].argmax(-1)]
    for index in range(steps - 1):
        predicted.append(step(sequence[:, prompt_len + index])[:, -1].argmax(-1))
    return torch.stack(predicted, dim=-1)
