"""``hfexport run DIR --prompt ...``: generate text with an exported model folder and its tokenizer.

The folder is what ``ExportedModel.save_pretrained`` wrote (``export_for_generation`` components) plus a tokenizer
saved beside it (``tokenizer.save_pretrained(DIR)``). The text goes to stdout; the timings (load, prefill, decode
tokens/s) to stderr, or everything as one JSON object with ``--json``.

Prefill and decode are timed apart with a streamer: ``generate`` hands the streamer the prompt, then each token as
it is chosen, so the first token's time is the prefill (time to first token) and the gaps after it are decode steps.

Example:
    $ hfexport run exported/ --prompt "The capital of France is" --max-new-tokens 16
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import HfExportError, UnsupportedError
from ..generation.streamers import TimingStreamer

__all__ = ["add_run_parser", "cmd_run", "TimingStreamer", "main"]

# Any one of these in a folder means a tokenizer was saved there.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "vocab.json",
    "vocab.txt",
)


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``run`` subcommand on ``subparsers`` (from ``parser.add_subparsers()``)."""
    p = subparsers.add_parser(
        "run",
        help="generate text with an exported folder (export_for_generation + a tokenizer saved beside it)",
        description="Generate text with an exported model folder and the tokenizer saved in it.",
    )
    p.add_argument("directory", type=Path, help="folder written by save_pretrained, with a tokenizer saved in it")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most (default: 64)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    p.add_argument("--do-sample", action="store_true", help="sample instead of the generation config's choice")
    p.add_argument("--greedy", action="store_true", help="greedy decoding whatever the generation config says")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=None, help="seed torch's RNG (for sampling)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_run)
    return p


def _load_tokenizer(directory: Path) -> Any:
    if not any((directory / name).is_file() for name in _TOKENIZER_FILES):
        raise UnsupportedError(
            f"{directory} has no tokenizer (none of {', '.join(_TOKENIZER_FILES[:3])}, ...). Save one beside the "
            f"export: AutoTokenizer.from_pretrained(MODEL).save_pretrained({str(directory)!r})"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
        raise UnsupportedError(f"cannot load the tokenizer saved in {directory}: {type(e).__name__}: {e}") from e


def _encode(tokenizer: Any, prompt: str, chat: bool) -> dict[str, Any]:
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise UnsupportedError("--chat: the tokenizer in this folder has no chat template; drop --chat")
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        # the template already holds the special tokens it wants
        encoded = tokenizer(text, return_tensors="pt", add_special_tokens=False)
    else:
        encoded = tokenizer(prompt, return_tensors="pt")
    if encoded["input_ids"].shape[-1] == 0:
        raise UnsupportedError("the prompt encodes to no tokens; pass a non-empty --prompt")
    return {k: encoded[k] for k in ("input_ids", "attention_mask") if k in encoded}


def _check_vocab(exported: Any, input_ids: Any) -> None:
    vocab = getattr(exported.config, "vocab_size", None) if exported.config is not None else None
    if vocab is None and exported.config is not None and hasattr(exported.config, "get_text_config"):
        vocab = getattr(exported.config.get_text_config(), "vocab_size", None)
    if vocab is not None and int(input_ids.max()) >= int(vocab):
        raise UnsupportedError(
            f"the tokenizer gives token id {int(input_ids.max())} but the exported model has vocab_size={vocab}: "
            "the tokenizer in this folder does not belong to this model"
        )


def _generation_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    if args.do_sample and args.greedy:
        raise UnsupportedError("--do-sample and --greedy exclude each other")
    if args.max_new_tokens < 1:
        raise UnsupportedError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if args.do_sample:
        kwargs["do_sample"] = True
    if args.greedy:
        kwargs["do_sample"] = False
    for key in ("temperature", "top_k", "top_p"):
        if getattr(args, key) is not None:
            kwargs[key] = getattr(args, key)
    return kwargs


def run(directory: Path, prompt: str, *, chat: bool = False, generation: dict[str, Any] | None = None,
        seed: int | None = None) -> dict[str, Any]:
    """Load ``directory``, generate for ``prompt``, and return the text, the token ids and the timings."""
    import torch

    from ..exported import ExportedModel

    directory = Path(directory)
    if not directory.is_dir():
        raise UnsupportedError(f"{directory} is not a folder; pass the folder that save_pretrained (or hfexport "
                               "export --output) wrote")
    tokenizer = _load_tokenizer(directory)
    start = time.perf_counter()
    exported = ExportedModel.from_pretrained(directory)
    load_s = time.perf_counter() - start
    missing = {"prefill", "decode"} - set(exported.components)
    if missing and "language_model" not in exported.components:
        raise UnsupportedError(
            f"{directory} holds the components {list(exported.components)}, not a generation export; re-export with "
            "export_for_generation (hfexport export --for-generation)"
        )
    inputs = _encode(tokenizer, prompt, chat)
    _check_vocab(exported, inputs["input_ids"])
    if seed is not None:
        torch.manual_seed(seed)
    generation = dict(generation or {})
    timer = TimingStreamer()
    sequences = exported.generate(**inputs, **generation, streamer=timer)
    total_s = time.perf_counter() - timer.start
    prompt_len = inputs["input_ids"].shape[-1]
    new_ids = sequences[0, prompt_len:].tolist()
    return {
        "directory": str(directory),
        "text": tokenizer.decode(new_ids, skip_special_tokens=True),
        "prompt_tokens": prompt_len,
        "new_tokens": len(new_ids),
        "token_ids": new_ids,
        "load_s": load_s,
        "generate_s": total_s,
        **timer.stats(),
    }


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def cmd_run(args: argparse.Namespace) -> int:
    result = run(args.directory, args.prompt, chat=args.chat, generation=_generation_kwargs(args), seed=args.seed)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(result["text"])
    print(
        f"[run] {result['new_tokens']} new tokens (prompt {result['prompt_tokens']}): "
        f"prefill {_fmt(result['prefill_s'], '.3f')} s, decode {_fmt(result['decode_tokens_per_s'], '.1f')} tok/s "
        f"({result['decode_steps']} steps in {result['decode_s']:.3f} s); load {result['load_s']:.1f} s",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m hfexport.cli.run DIR --prompt ...``: the ``run`` subcommand on its own (``run`` may be omitted)."""
    parser = argparse.ArgumentParser(prog="hfexport")
    add_run_parser(parser.add_subparsers(dest="command", required=True))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv if argv[:1] == ["run"] else ["run", *argv])
    try:
        return args.func(args)
    except HfExportError as e:  # as `hfexport run` reports it
        print(f"hfexport: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
