"""The peer: transformers' own ONNX exporter (``transformers.exporters``) on the same model and the same runtime.

Only benchmarks import the peer (the library never does). Its export is run the way the spec documents running it:

- ``export_child``: ``transformers.exporters`` ``OnnxExporter().export_for_generation`` of SmolLM2-135M with a static
  cache of 256, ``multi_token_decode=True`` and ``ort_fusions="cpu"`` (its fastest CPU configuration), then its
  ``save_pretrained``; wall time, peak RSS and bytes on disk, in a child process of its own.
- ``SpecLoop``: the spec's ONNX Runtime decode loop (guide, "Decode-loop inference examples") on CPU: the peer's
  ``decode.onnx`` alone, the whole prompt in one call, then one token per call, each ``input.<name>`` /
  ``output.<name>`` cache pair bound onto one buffer through io-binding (the CPU equivalent of ``CudaSession
  .set_buffer_sharing``), so the peer gets its best loop and no copy of the cache.
- ``peer_runner.RunnerLoop`` (any format): the same export through the peer's own runner
  (``ExportedModel.runners["decode"]``) with a transformers ``StaticCache``, in a process of its own: what its
  library gives a user who writes no io-binding.
- ``peer_overhead``: per decode step, the wall time of the peer's own runner (``ExportedModel.runners["decode"]``)
  minus the time inside ``run_with_iobinding``, on the tiny Llama: the library's cost per step, as ours is measured.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from common import TimedMethod, loop_stats, measure_export, ort_session_options, overhead_row, static_generation_config

PEER_LABEL = "transformers.exporters ONNX (peer), static cache 256 + multi-token decode, ort_fusions='cpu'"


def peer_export(model: Any, sample: dict, max_cache_len: int) -> Any:
    from transformers.exporters.exporter_onnx import OnnxConfig, OnnxExporter

    return OnnxExporter().export_for_generation(
        model, sample, OnnxConfig(dynamic=True, ort_fusions="cpu"),
        generation_config=static_generation_config(model, max_cache_len), multi_token_decode=True,
    )


def export_child(out: Path, max_cache_len: int) -> dict:
    record, exported = measure_export("peer", out, lambda model, sample: peer_export(model, sample, max_cache_len))
    record["graphs"] = len(exported.components)
    return record


_ORT_TO_NUMPY = {"tensor(float)": np.float32, "tensor(int64)": np.int64, "tensor(bool)": np.bool_,
                 "tensor(float16)": np.float16, "tensor(int32)": np.int32}


class SpecLoop:
    """The spec's ONNX Runtime decode loop on CPU over one ``decode.onnx`` (io-binding, cache pairs on one buffer)."""

    def __init__(self, path: Path, max_cache_len: int, session_options: Any = None):
        import onnxruntime as ort

        self.session = ort.InferenceSession(str(path), session_options, providers=["CPUExecutionProvider"])
        self.max_cache_len = max_cache_len
        self.binding = self.session.io_binding()
        self.cache: dict[str, np.ndarray] = {}
        for spec in self.session.get_inputs():
            if not spec.name.startswith("input."):
                continue
            # the one symbolic axis of a cache input is its length; digits in a string are a fixed size
            dims = [max_cache_len if isinstance(d, str) and not d.isdigit() else int(d) for d in spec.shape]
            buf = np.zeros(dims, dtype=_ORT_TO_NUMPY[spec.type])
            self.cache[spec.name[len("input."):]] = buf
            for kind, name in (("input", spec.name), ("output", "output." + spec.name[len("input."):])):
                bind = self.binding.bind_input if kind == "input" else self.binding.bind_output
                bind(name, "cpu", 0, buf.dtype, list(buf.shape), buf.ctypes.data)
        spec = next(o for o in self.session.get_outputs() if o.name.endswith("logits"))
        self.logits_name, self.vocab_size = spec.name, int(spec.shape[-1])
        self.logits = np.empty(0, np.float32)

    def _bind(self, feeds: dict[str, np.ndarray]) -> None:
        """Bind the feeds by pointer, and the logits onto a buffer of ours (the spec's ``allocate_buffers``)."""
        for name, array in feeds.items():
            self.binding.bind_input(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        self.logits = np.empty((1, feeds["input_ids"].shape[1], self.vocab_size), np.float32)
        self.binding.bind_output(self.logits_name, "cpu", 0, np.float32, list(self.logits.shape),
                                 self.logits.ctypes.data)

    def _run(self) -> np.ndarray:
        self.session.run_with_iobinding(self.binding)
        return self.logits

    def generate(self, prompt_ids: torch.Tensor, new_tokens: int) -> tuple[list[int], dict]:
        for buf in self.cache.values():
            buf.fill(0)
        ids = prompt_ids.numpy().astype(np.int64)
        prompt_len = ids.shape[1]
        slots = np.arange(self.max_cache_len)
        start = time.perf_counter()
        positions = np.arange(prompt_len)
        mask = (slots[None, :] <= positions[:, None])[None, None]
        feeds = {"input_ids": ids, "attention_mask": np.ascontiguousarray(mask), "position_ids": positions[None].copy()}
        self._bind(feeds)
        tokens = [int(self._run()[0, -1].argmax())]
        first = time.perf_counter()
        # decode: one-token buffers bound once and refilled in place, as in the spec
        input_ids = np.empty((1, 1), np.int64)
        position_ids = np.empty((1, 1), np.int64)
        attention_mask = np.empty((1, 1, 1, self.max_cache_len), np.bool_)
        self._bind({"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids})
        for position in range(prompt_len, prompt_len + new_tokens - 1):
            input_ids[0, 0] = tokens[-1]
            position_ids[0, 0] = position
            attention_mask[0, 0, 0] = slots <= position
            tokens.append(int(self._run()[0, -1].argmax()))
        return tokens, loop_stats(start, first, time.perf_counter(), tokens)


def peer_overhead(steps: int, prompt_len: int = 12) -> dict:
    """Per-step cost of the peer's runner around ONNX Runtime on the tiny Llama (1 thread), in a spec-style loop."""
    from transformers import StaticCache

    from hfexport.testing.tiny import TINY_CASES

    case = TINY_CASES["llama"]
    model = case.build()
    max_cache_len = prompt_len + steps + 8
    exported = peer_export(model, case.inputs(1, 6), max_cache_len)
    exported.to("cpu", session_options=ort_session_options(1))
    runner = exported.runners["decode"]
    runner.session = timed = TimedMethod(runner.session, "run_with_iobinding")
    inside = timed.times
    cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
    ids = case.inputs(1, prompt_len)["input_ids"]
    with torch.no_grad():  # a StaticCache allocates its layers lazily, on its first update: let eager do that
        model(input_ids=ids, past_key_values=cache)
    cache.reset()
    slots = torch.arange(max_cache_len)
    positions = torch.arange(prompt_len)
    out = runner(input_ids=ids, attention_mask=(slots[None, :] <= positions[:, None])[None, None],
                 position_ids=positions[None], past_key_values=cache)
    cache = getattr(out, "past_key_values", None) or cache
    token = out.logits[:, -1:].argmax(-1)
    # the spec's loop: one-token buffers refilled in place
    input_ids, position_ids = torch.empty((1, 1), dtype=torch.long), torch.empty((1, 1), dtype=torch.long)
    attention_mask = torch.empty((1, 1, 1, max_cache_len), dtype=torch.bool)
    inside.clear()
    start = time.perf_counter()
    for position in range(prompt_len, prompt_len + steps):
        input_ids.copy_(token)
        position_ids.fill_(position)
        attention_mask[0, 0, 0].copy_(slots <= position)
        out = runner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     past_key_values=cache)
        cache = getattr(out, "past_key_values", None) or cache
        token = out.logits[:, -1:].argmax(-1)
    step_ms = 1e3 * (time.perf_counter() - start) / steps
    ort_ms = 1e3 * sum(inside) / steps
    return overhead_row(step_ms, ort_ms)
