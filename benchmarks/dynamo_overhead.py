"""Per-step Python overhead of ``ExportedModel.generate`` on the Dynamo backend (part of bench_dynamo.py).

On the tiny Llama, where the graph itself is cheap: the wall time of a decode step (streamer timestamps) minus the
time spent inside the decode program's ``ExportedProgram.module()`` call in those same steps, plus a bare loop over
``module()`` (the guide's loop shape) for reference.
"""

from __future__ import annotations

import argparse
import copy
import time
from typing import Any

import torch


# --- per-step overhead on a tiny model -------------------------------------------------------------------------


def _time_module_calls(exported: Any) -> list[float]:
    """Wrap the decode runner's ``ExportedProgram.module()`` so each call's time is recorded."""
    runner = exported.runner("decode")
    inner = runner._module  # the module() of the decode program; DynamoRunner.run calls it once per step
    times: list[float] = []

    def timed(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        out = inner(*a, **kw)
        times.append(time.perf_counter() - t)
        return out

    runner._module = timed
    return times


def _bare_static_loop(exported: Any, prompt: torch.Tensor, steps: int) -> float:
    """The guide's loop (reused buffers, module() only) on the static decode program: seconds per decode step."""
    program = exported.components["decode"].program
    decode = program.module()
    _, example = program.example_inputs
    cache = copy.deepcopy(example["past_key_values"])
    cache.reset()
    extra = {k: v for k, v in example.items()
             if k not in ("input_ids", "attention_mask", "position_ids", "past_key_values")}
    max_len = cache.layers[0].max_cache_len
    n = prompt.shape[-1]
    positions = torch.arange(n)
    mask = (torch.arange(max_len)[None, :] <= positions[:, None])[None, None]
    with torch.no_grad():
        logits = decode(input_ids=prompt, attention_mask=mask, position_ids=positions[None], past_key_values=cache,
                        **extra).logits
        token = logits[:, -1:].argmax(-1)
        ids, pos = torch.empty((1, 1), dtype=torch.long), torch.empty((1, 1), dtype=torch.long)
        step_mask = torch.empty((1, 1, 1, max_len), dtype=torch.bool)
        slots = torch.arange(max_len)
        start = time.perf_counter()
        for position in range(n, n + steps):
            ids.copy_(token)
            pos.fill_(position)
            step_mask[0, 0, 0].copy_(slots <= position)
            token = decode(input_ids=ids, attention_mask=step_mask, position_ids=pos, past_key_values=cache,
                           **extra).logits[:, -1:].argmax(-1)
        return (time.perf_counter() - start) / steps


def bench_overhead(args: argparse.Namespace) -> dict:
    """Per-step overhead on the tiny Llama, with one torch thread: its ops are so small that a second thread only
    adds synchronisation (3-4x slower steps when other processes share the cores), which would drown the Python
    overhead this measures."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _bench_overhead(args)
    finally:
        torch.set_num_threads(threads)


def _bench_overhead(args: argparse.Namespace) -> dict:
    from bench_dynamo import VARIANTS, export_variant, timed_generate

    from hfexport.testing.tiny import TINY_CASES

    case = TINY_CASES["llama"]
    model = case.build()
    sample = case.inputs(1, 6)
    prompt = case.inputs(1, 12)
    prompt = {"input_ids": prompt["input_ids"], "attention_mask": prompt["attention_mask"]}
    steps = args.overhead_tokens
    # no EOS stop, so every run makes the same number of steps
    rows = {}
    eager_tokens, eager_stats = None, None
    for _ in range(2):
        eager_tokens, eager_stats = timed_generate(
            lambda **kw: model.generate(**kw, eos_token_id=None), prompt, steps + 1
        )
    rows["eager"] = {"step_ms": 1e3 * eager_stats["decode_s"] / eager_stats["decode_steps"]}
    for variant in VARIANTS:
        exported = export_variant(model, sample, variant, max_cache_len=prompt["input_ids"].shape[-1] + steps + 8)
        times = _time_module_calls(exported)
        gen = lambda **kw: exported.generate(**kw, eos_token_id=None)  # noqa: E731
        timed_generate(gen, prompt, 8)  # warm-up
        times.clear()
        tokens, stats = timed_generate(gen, prompt, steps + 1)
        step_ms = 1e3 * stats["decode_s"] / stats["decode_steps"]
        # the module() calls of the decode steps that fall between the first and the last token
        module_ms = 1e3 * sum(times[: stats["decode_steps"]]) / stats["decode_steps"]
        row = {"step_ms": step_ms, "module_ms": module_ms, "overhead_ms": step_ms - module_ms,
               "same_tokens": tokens == eager_tokens}
        if variant == "static":
            row["bare_loop_ms"] = 1e3 * _bare_static_loop(exported, prompt["input_ids"], steps)
        rows[variant] = row
    return {"model": "tiny Llama (2 layers, hidden 64, vocab 256), 1 torch thread", "steps": steps, "rows": rows}
