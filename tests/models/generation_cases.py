"""Shared pieces of the per-backend generation tests: inputs without decoder prompts, and the cache configs."""

from __future__ import annotations

import copy


def text_inputs(case, batch, seq):
    """Generate kwargs of a tiny case: its inputs without ``decoder_*`` (generate() starts the decoder itself)."""
    return {k: v for k, v in case.inputs(batch, seq).items() if not k.startswith("decoder")}


def generation_config(model, cache):
    """Greedy generation config of ``model``; ``cache="static"`` gives a 64-position static cache."""
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample = False
    if cache == "static":
        gen.cache_implementation = "static"
        gen.max_cache_len = 64
    return gen
