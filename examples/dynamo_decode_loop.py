"""The guide's Dynamo decode-loop example, run on CPU against an hfexport export.

Guide: "Decode-loop inference examples", Dynamo tab. The loop below is the guide's code with
``transformers.exporters`` read as ``hfexport`` and ``device="cuda"`` read as CPU; the only additions are a
preamble that makes ``decode.pt2`` (``export_for_generation`` with a static cache and ``multi_token_decode=True``)
and a stop after ``--max-new-tokens`` tokens.

    # tiny random Llama (seeded), export + loop in one process
    python examples/dynamo_decode_loop.py --output /tmp/decode-export

    # a local Hugging Face folder (config, weights, tokenizer) and a text prompt
    python examples/dynamo_decode_loop.py path/to/model --prompt "The capital of France is" --output /tmp/x

    # the loop alone, in a fresh interpreter, from an existing export (what a deployment does)
    python examples/dynamo_decode_loop.py --skip-export --output /tmp/decode-export

The loop half imports only what the guide imports (torch, ``StaticCache``, ``register_pytree_node``); the
preamble's imports stay inside :func:`export_decode`, so ``--skip-export`` checks that the saved artifact loads
with nothing else in the process.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
from transformers import StaticCache

from hfexport.exporter_dynamo import register_pytree_node

# A prompt for the tiny Llama (vocab 256; 0/1/2 are pad/bos/eos), fixed so runs are comparable.
TINY_PROMPT_IDS = [1, 17, 42, 99, 7, 23, 64, 11, 5]
MAX_CACHE_LEN = 64


def export_decode(model_dir: str | None, output: Path, max_cache_len: int) -> None:
    """Preamble: export the multi-token decode over a static cache (it also serves the prefill: one ``decode.pt2``)
    and save it to ``output``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from hfexport import DynamoConfig, DynamoExporter

    if model_dir is None:
        from hfexport.testing.tiny import TINY_CASES

        case = TINY_CASES["llama"]
        model, tokenizer = case.build(), None
        sample = case.inputs(1, 6)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        sample = dict(tokenizer(["Hello, world!"], return_tensors="pt"))
    generation_config = GenerationConfig(
        cache_implementation="static",
        max_cache_len=max_cache_len,
        do_sample=False,
        eos_token_id=model.generation_config.eos_token_id,
        pad_token_id=model.generation_config.pad_token_id,
        bos_token_id=model.generation_config.bos_token_id,
    )
    exported = DynamoExporter().export_for_generation(
        model,
        sample,
        DynamoConfig(dynamic=True),
        generation_config=generation_config,
        multi_token_decode=True,
    )
    exported.save_pretrained(output)
    if tokenizer is not None:
        tokenizer.save_pretrained(output)


def decode_loop(
    output: Path, prompt: str | None, prompt_ids: list[int] | None, max_new_tokens: int | None
) -> tuple[list[int], list[int]]:
    """The guide's loop over ``output/decode.pt2``; returns the prompt ids and the greedy tokens."""
    register_pytree_node(StaticCache)
    exported = torch.export.load(str(output / "decode.pt2"))
    decode = exported.module()  # runs on the device its inputs / cache live on (CPU here)

    # the artifact carries an initialized StaticCache template — reuse it (reset to empty)
    _, example_kwargs = exported.example_inputs
    past_key_values = copy.deepcopy(example_kwargs["past_key_values"])
    past_key_values.reset()
    max_cache_len = past_key_values.layers[0].max_cache_len

    if prompt is not None:
        from transformers import AutoTokenizer

        prompt_ids = AutoTokenizer.from_pretrained(output)(prompt)["input_ids"]
    prompt_list = list(prompt_ids)
    prompt_ids = torch.tensor([prompt_list], dtype=torch.long)
    prompt_len = prompt_ids.shape[1]

    def causal_mask(positions, cache_len):  # [1, 1, len(positions), cache_len]
        return (torch.arange(cache_len, device="cpu")[None, :] <= positions[:, None])[None, None]

    # prefill: the whole prompt in one call
    positions = torch.arange(prompt_len, device="cpu")
    logits = decode(input_ids=prompt_ids, attention_mask=causal_mask(positions, max_cache_len),
                    position_ids=positions[None], past_key_values=past_key_values).logits
    next_token = logits[:, -1:].argmax(-1)
    generated = [int(next_token)]

    # decode: query=1 buffers reused in place
    input_ids = torch.empty((1, 1), dtype=torch.long, device="cpu")
    position_ids = torch.empty((1, 1), dtype=torch.long, device="cpu")
    attention_mask = torch.empty((1, 1, 1, max_cache_len), dtype=torch.bool, device="cpu")
    slots = torch.arange(max_cache_len, device="cpu")
    stop = max_cache_len if max_new_tokens is None else min(max_cache_len, prompt_len + max_new_tokens - 1)
    for position in range(prompt_len, stop):
        input_ids.copy_(next_token)
        position_ids.fill_(position)
        attention_mask[0, 0, 0].copy_(slots <= position)
        logits = decode(input_ids=input_ids, attention_mask=attention_mask,
                        position_ids=position_ids, past_key_values=past_key_values).logits
        next_token = logits[:, -1:].argmax(-1)
        generated.append(int(next_token))
    return prompt_list, generated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", help="local HF model folder (default: the tiny seeded Llama)")
    parser.add_argument("--output", type=Path, default=Path("decode-export"), help="export folder (decode.pt2 ...)")
    parser.add_argument("--max-cache-len", type=int, default=MAX_CACHE_LEN)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default: until the cache is full")
    parser.add_argument("--prompt", help="text prompt (needs a tokenizer: a model folder)")
    parser.add_argument("--prompt-ids", help="comma-separated token ids (default for the tiny Llama)")
    parser.add_argument("--skip-export", action="store_true", help="only run the loop from --output")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)

    if not args.skip_export:
        export_decode(args.model, args.output, args.max_cache_len)
    prompt_ids = None
    if args.prompt is None:
        prompt_ids = [int(t) for t in args.prompt_ids.split(",")] if args.prompt_ids else TINY_PROMPT_IDS
    prompt_ids, generated = decode_loop(args.output, args.prompt, prompt_ids, args.max_new_tokens)
    if args.json:
        print(json.dumps({"prompt_ids": prompt_ids, "generated_ids": generated}))
    else:
        print(f"generated ids: {generated}")
        if args.prompt is not None:
            from transformers import AutoTokenizer

            print(AutoTokenizer.from_pretrained(args.output).decode(generated))
    return 0


if __name__ == "__main__":
    sys.exit(main())
