"""The peer's export (``transformers.exporters``, any format) driven by its own runner, as its user would.

Only benchmarks import the peer (the library never does). ``RunnerLoop`` runs the loop in a child process of its own
that never imports hfexport; the bench scripts of every backend use it for the peer's decode row.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from common import loop_stats


class RunnerLoop:
    """The peer's export driven by its own runner, as a user of its library would without writing io-binding code:
    ``ExportedModel.from_pretrained`` then ``runners["decode"](..., past_key_values=cache)`` for the prompt and for
    each token, with a transformers ``StaticCache`` (the runner binds it in and returns the updated cache, which the
    next call takes). Masks and positions as in :class:`SpecLoop`.

    It runs in a process of its own (``python peer_runner.py FOLDER ...``) that never imports hfexport: both
    libraries register ``StaticCache`` as a pytree node under different names, and in one process the peer's loader
    finds ours. Even alone, the peer's ``from_pretrained`` of its own static export fails ("Deserializing
    transformers.cache_utils:StaticCache in pytree is not registered": its loader looks for cache classes with a
    regex that misses them in the nested, escaped part of the saved spec), so the child first registers the cache
    class with the peer's own ``register_pytree_node``, as its user would."""

    def __init__(self, folder: Path, max_cache_len: int):
        self.folder, self.max_cache_len = Path(folder), max_cache_len

    def generate(self, prompt_ids: torch.Tensor, new_tokens: int) -> tuple[list[int], dict]:
        import json
        import subprocess
        import sys

        command = [sys.executable, __file__, str(self.folder), str(self.max_cache_len),
                   str(new_tokens), ",".join(str(int(t)) for t in prompt_ids[0])]
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            raise RuntimeError(f"the peer's runner loop failed: {done.stderr[-2000:]}")
        record = json.loads(lines[-1])
        return record["tokens"], record["stats"]


def _runner_child(folder: str, max_cache_len: int, new_tokens: int, ids: list[int]) -> dict:
    from transformers import AutoConfig, StaticCache
    from transformers.exporters import ExportedModel as PeerExportedModel
    from transformers.exporters.exporter_dynamo import register_pytree_node

    register_pytree_node(StaticCache)
    runner = PeerExportedModel.from_pretrained(folder).runners["decode"]
    config = AutoConfig.from_pretrained(folder)
    prompt = torch.tensor([ids])

    # a StaticCache allocates its layers on its first update: let a (random-weight) eager model of the same config
    # do that once, as the peer's users do, then reuse the zeroed cache in every loop
    from transformers import AutoModelForCausalLM

    cache = StaticCache(config=config, max_cache_len=max_cache_len)
    with torch.no_grad():
        AutoModelForCausalLM.from_config(config)(input_ids=prompt[:, :1], past_key_values=cache)

    def loop(count: int) -> tuple[list[int], dict]:
        cache.reset()
        slots = torch.arange(max_cache_len)
        start = time.perf_counter()
        positions = torch.arange(len(ids))
        with torch.no_grad():
            out = runner(input_ids=prompt, attention_mask=(slots[None, :] <= positions[:, None])[None, None],
                         position_ids=positions[None], past_key_values=cache)
            current = getattr(out, "past_key_values", None) or cache
            token = out.logits[:, -1:].argmax(-1)
            tokens = [int(token)]
            first = time.perf_counter()
            for position in range(len(ids), len(ids) + count - 1):
                out = runner(input_ids=token, attention_mask=(slots <= position)[None, None, None],
                             position_ids=torch.tensor([[position]]), past_key_values=current)
                current = getattr(out, "past_key_values", None) or current
                token = out.logits[:, -1:].argmax(-1)
                tokens.append(int(token))
        return tokens, loop_stats(start, first, time.perf_counter(), tokens)

    loop(4)  # warm-up, as every other row gets
    tokens, stats = loop(new_tokens)
    return {"tokens": tokens, "stats": stats}


if __name__ == "__main__":
    import json
    import sys

    folder, cache_len, count, prompt = sys.argv[1:5]
    print(json.dumps(_runner_child(folder, int(cache_len), int(count), [int(t) for t in prompt.split(",")])))
