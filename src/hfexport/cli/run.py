"""``hfexport run DIR --prompt ... | --chat | --image FILE | --audio FILE``: generate text with an exported model
folder and its tokenizer (or processor).

The folder is what ``ExportedModel.save_pretrained`` wrote (``export_for_generation`` components) plus a tokenizer
saved beside it (``tokenizer.save_pretrained(DIR)``). The text goes to stdout; the timings (load, prefill, decode
tokens/s) to stderr, or everything as one JSON object with ``--json``.

``--chat`` holds a conversation: user turns are read from standard input, one line per turn, until an empty line
or end of input (``--prompt``, when given, is the first turn). Each turn applies the tokenizer's chat template to
the whole conversation so far and streams the reply to stdout as it is generated, one reply per line (or lines).

Generation arguments (``--num-beams``, ``--repetition-penalty``, ...) are passed to ``ExportedModel.generate``;
one that it does not honour yet is refused by name before anything loads, never dropped.

``--image FILE`` (an image-text-to-text export) and ``--audio FILE`` (a speech export, WAV) go through the processor
saved in the folder, as ``processor(text=..., images=...)`` / ``feature_extractor(audio)`` would for
``model.generate``; the image is placed in the prompt with the processor's chat template or its image token.

Example:
    $ hfexport run exported/ --prompt "The capital of France is" --max-new-tokens 16
    $ hfexport run exported-vlm/ --image cat.png --prompt "What is in the picture?"
    $ hfexport run exported-whisper/ --audio speech.wav
    $ printf 'Hi!\\nTell me more.\\n' | hfexport run exported/ --chat --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

from ..errors import HfExportError, UnsupportedError
from .quiet import terminal
from .timing import TextPrinter, timed_generate

__all__ = ["add_run_parser", "cmd_run", "run", "chat", "main", "has_tokenizer", "load_processor", "media_inputs",
           "load_tokenizer", "load_generation_export", "add_trust_flag", "check_vocab", "vocab_size", "generation_kwargs"]

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

# generate() argument -> the flag that sets it; each is checked against what ExportedModel.generate accepts
_GENERATION_FLAGS = {
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "num_beams": "--num-beams",
    "repetition_penalty": "--repetition-penalty",
    "no_repeat_ngram_size": "--no-repeat-ngram-size",
    "min_new_tokens": "--min-new-tokens",
}


def add_run_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``run`` subcommand on ``subparsers`` (from ``parser.add_subparsers()``)."""
    p = subparsers.add_parser(
        "run",
        help="generate text or chat with an exported folder (export_for_generation + a tokenizer saved beside it)",
        description="Generate text with an exported model folder and the tokenizer saved in it.",
    )
    p.add_argument("directory", type=Path, help="folder written by save_pretrained, with a tokenizer saved in it")
    p.add_argument("--prompt", default=None, help="the prompt text (with --chat: the first user turn, optional)")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens to generate at most (default: 64)")
    p.add_argument("--chat", action="store_true",
                   help="multi-turn chat with the tokenizer's chat template: one user turn per line of standard "
                        "input, until an empty line or end of input")
    p.add_argument("--do-sample", action="store_true", help="sample instead of the generation config's choice")
    p.add_argument("--greedy", action="store_true", help="greedy decoding whatever the generation config says")
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--num-beams", type=int, default=None, help="beam search with N beams (no streaming)")
    p.add_argument("--repetition-penalty", type=float, default=None)
    p.add_argument("--no-repeat-ngram-size", type=int, default=None)
    p.add_argument("--min-new-tokens", type=int, default=None, help="no end-of-sequence before N new tokens")
    p.add_argument("--image", type=Path, action="append", default=None, metavar="FILE",
                   help="an image for an image-text-to-text export (repeat for several); the folder's processor "
                        "places it in the prompt (its chat template, or its image token)")
    p.add_argument("--audio", type=Path, default=None, metavar="FILE",
                   help="a WAV file for a speech export (Whisper, ...): the folder's feature extractor turns it into "
                        "the model's input (resampled to its rate); the transcript is printed")
    p.add_argument("--seed", type=int, default=None, help="seed torch's RNG (for sampling)")
    p.add_argument("--json", action="store_true", help="print one JSON object (with --chat: at the end, no stream)")
    add_trust_flag(p)
    p.set_defaults(func=cmd_run)
    return p


# --- the folder ---------------------------------------------------------------------------------------------------


def add_trust_flag(parser: argparse.ArgumentParser) -> None:
    """``--trust-remote-code``: what ``from_pretrained(trust_remote_code=True)`` says, for the commands that load."""
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="load compiled code an export holds (an AOTInductor package's shared library, which "
                             "runs as it loads): only for folders from a source you trust")


def has_tokenizer(directory: Path) -> bool:
    """Whether a tokenizer was saved in ``directory``."""
    return any((Path(directory) / name).is_file() for name in _TOKENIZER_FILES)


def load_tokenizer(directory: Path) -> Any:
    """The tokenizer saved in ``directory``; a clear error when there is none or it does not load."""
    directory = Path(directory)
    if not has_tokenizer(directory):
        raise UnsupportedError(
            f"{directory} has no tokenizer (none of {', '.join(_TOKENIZER_FILES[:3])}, ...). Save one beside the "
            f"export: AutoTokenizer.from_pretrained(MODEL).save_pretrained({str(directory)!r})"
        )
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
        raise UnsupportedError(f"cannot load the tokenizer saved in {directory}: {type(e).__name__}: {e}") from e


def _check_folder(directory: Path) -> None:
    if not directory.is_dir():
        raise UnsupportedError(f"{directory} is not a folder; pass the folder that save_pretrained (or hfexport "
                               "export --output) wrote")


def load_generation_export(directory: Path, trust_remote_code: bool = False) -> tuple[Any, float]:
    """``ExportedModel.from_pretrained(directory)`` and the seconds it took; refuses a non-generation export.
    ``trust_remote_code``: load compiled code (an AOTInductor export's library), as ``--trust-remote-code`` says."""
    from ..exported import ExportedModel

    directory = Path(directory)
    _check_folder(directory)
    start = time.perf_counter()
    exported = ExportedModel.from_pretrained(directory, trust_remote_code=trust_remote_code)
    load_s = time.perf_counter() - start
    missing = {"prefill", "decode"} - set(exported.components)
    if missing and "language_model" not in exported.components:
        raise UnsupportedError(
            f"{directory} holds the components {list(exported.components)}, not a generation export; re-export with "
            "export_for_generation (hfexport export --for-generation)"
        )
    return exported, load_s


def vocab_size(exported: Any) -> int | None:
    """The exported model's vocabulary size, from its config (the text config of a multimodal one)."""
    config = exported.config
    if config is None:
        return None
    vocab = getattr(config, "vocab_size", None)
    if vocab is None and hasattr(config, "get_text_config"):
        vocab = getattr(config.get_text_config(), "vocab_size", None)
    return None if vocab is None else int(vocab)


def check_vocab(exported: Any, input_ids: Any) -> None:
    """Refuse token ids the exported model's embedding does not have (a tokenizer of another model)."""
    vocab = vocab_size(exported)
    if vocab is not None and int(input_ids.max()) >= vocab:
        raise UnsupportedError(
            f"the tokenizer gives token id {int(input_ids.max())} but the exported model has vocab_size={vocab}: "
            "the tokenizer in this folder does not belong to this model"
        )


# --- prompts and generation arguments --------------------------------------------------------------------------


def _chat_text(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise UnsupportedError("--chat: the tokenizer in this folder has no chat template; drop --chat")
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _encode(tokenizer: Any, prompt: str | None = None, messages: list[dict[str, str]] | None = None) -> dict[str, Any]:
    if messages is not None:
        # the template already holds the special tokens it wants
        encoded = tokenizer(_chat_text(tokenizer, messages), return_tensors="pt", add_special_tokens=False)
    else:
        encoded = tokenizer(prompt, return_tensors="pt")
    if encoded["input_ids"].shape[-1] == 0:
        raise UnsupportedError("the prompt encodes to no tokens; pass a non-empty --prompt")
    return {k: encoded[k] for k in ("input_ids", "attention_mask") if k in encoded}


def _accepted_generation_keys() -> tuple[str, ...]:
    # what ExportedModel.generate reads today; anything else would reach the graphs as an input or be lost
    from ..generation.dispatch import GENERATION_ARGUMENTS

    return tuple(GENERATION_ARGUMENTS)


def generation_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The ``generate`` arguments the flags ask for; a flag ``ExportedModel.generate`` does not honour is refused."""
    if args.do_sample and args.greedy:
        raise UnsupportedError("--do-sample and --greedy exclude each other")
    if args.max_new_tokens < 1:
        raise UnsupportedError(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    kwargs: dict[str, Any] = {"max_new_tokens": args.max_new_tokens}
    if args.do_sample:
        kwargs["do_sample"] = True
    if args.greedy:
        kwargs["do_sample"] = False
    accepted = _accepted_generation_keys()
    for key, flag in _GENERATION_FLAGS.items():
        value = getattr(args, key, None)
        if value is None:
            continue
        if key not in accepted:
            raise UnsupportedError(
                f"{flag} ({key}) is not supported by ExportedModel.generate yet; drop {flag} "
                f"(it accepts: {', '.join(k for k in accepted if k in _GENERATION_FLAGS or k == 'max_new_tokens')})"
            )
        if key in ("num_beams",) and value < 1:
            raise UnsupportedError(f"{flag} must be at least 1, got {value}")
        if key in ("min_new_tokens", "top_k", "no_repeat_ngram_size") and value < 0:
            raise UnsupportedError(f"{flag} must be at least 0, got {value}")
        kwargs[key] = value
    return kwargs


def _generate(exported: Any, inputs: dict[str, Any], generation: dict[str, Any], printer: Any = None
              ) -> tuple[list[int], dict[str, Any]]:
    # beam search takes no streamer (as model.generate): no prefill/decode split, and the text comes at the end
    timed = (generation.get("num_beams") or 1) == 1
    prompt_len = 0 if "encoder" in exported.components else None  # an encoder-decoder's sequences hold no prompt
    return timed_generate(exported.generate, inputs, streamer=printer if timed else None, timed=timed,
                          prompt_len=prompt_len, **generation)


# --- images and audio ----------------------------------------------------------------------------------------------


def load_processor(directory: Path, need: str) -> tuple[Any, Any]:
    """``(processor, tokenizer)`` saved in ``directory`` for ``need`` (``"image"`` or ``"audio"``): the folder's
    ``AutoProcessor``, or its image processor / feature extractor and tokenizer saved apart."""
    from transformers import AutoFeatureExtractor, AutoImageProcessor, AutoProcessor

    from .media import processor_parts

    directory = Path(directory)
    part = "image_processor" if need == "image" else "feature_extractor"
    try:
        processor = AutoProcessor.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError):
        processor = None
    tokenizer, image_processor, feature_extractor = processor_parts(processor)
    if (image_processor if need == "image" else feature_extractor) is not None and tokenizer is not None:
        return processor, tokenizer
    loader = AutoImageProcessor if need == "image" else AutoFeatureExtractor
    try:
        alone = loader.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
        raise UnsupportedError(
            f"--{need}: {directory} holds no {part.replace('_', ' ')} ({type(e).__name__}: {e}); save the model's "
            f"processor beside the export: AutoProcessor.from_pretrained(MODEL).save_pretrained({str(directory)!r})"
        ) from e
    return alone, tokenizer if tokenizer is not None else load_tokenizer(directory)


def media_inputs(directory: Path, prompt: str | None, images: list[Path] | None, audio: Path | None
                 ) -> tuple[dict[str, Any], Any]:
    """The generate inputs for ``--image`` files and the prompt (the processor's whole output: pixel values,
    grids, token types, ...) or for an ``--audio`` file (its features), and the tokenizer that decodes the reply."""
    from .media import image_prompt, load_audio, load_image

    if images:
        processor, tokenizer = load_processor(directory, "image")
        if not callable(processor) or not hasattr(processor, "image_processor"):
            raise UnsupportedError(
                f"--image: {directory} holds an image processor but no processor that joins it with the text "
                "(processor_config.json); save AutoProcessor.from_pretrained(MODEL) beside the export"
            )
        pictures = [load_image(path) for path in images]
        text = image_prompt(processor, prompt if prompt is not None else "Describe the image.", len(pictures))
        encoded = processor(text=[text], images=pictures, return_tensors="pt")
        return dict(encoded), tokenizer
    extractor, tokenizer = load_processor(directory, "audio")
    extractor = getattr(extractor, "feature_extractor", extractor)
    rate = int(getattr(extractor, "sampling_rate", 16000))
    samples = load_audio(audio, rate)
    encoded = extractor(samples, sampling_rate=rate, return_tensors="pt")
    return {k: v for k, v in encoded.items() if k in ("input_features", "input_values", "attention_mask")}, tokenizer


# --- one prompt ------------------------------------------------------------------------------------------------


def run(directory: Path, prompt: str | None, *, trust_remote_code: bool = False, chat: bool = False, generation: dict[str, Any] | None = None,
        seed: int | None = None, images: list[Path] | None = None, audio: Path | None = None) -> dict[str, Any]:
    """Load ``directory``, generate for ``prompt`` (with ``images``, or for ``audio``), and return the text, the
    token ids and the timings."""
    import torch

    directory = Path(directory)
    _check_folder(directory)
    if images or audio is not None:
        if images and audio is not None:
            raise UnsupportedError("--image and --audio exclude each other: an export takes one kind of media")
        if audio is not None and prompt is not None:
            raise UnsupportedError("--prompt with --audio: a decoder prompt for speech models is not supported yet; "
                                   "drop --prompt (the transcript is generated from the audio alone)")
        inputs, tokenizer = media_inputs(directory, prompt, images, audio)
    else:
        tokenizer = load_tokenizer(directory)
        inputs = _encode(tokenizer, prompt, [{"role": "user", "content": prompt}] if chat else None)
    exported, load_s = load_generation_export(directory, trust_remote_code)
    if "input_ids" in inputs:
        check_vocab(exported, inputs["input_ids"])
    if seed is not None:
        torch.manual_seed(seed)
    new_ids, stats = _generate(exported, inputs, dict(generation or {}))
    return {
        "directory": str(directory),
        "text": tokenizer.decode(new_ids, skip_special_tokens=True),
        "prompt_tokens": inputs["input_ids"].shape[-1] if "input_ids" in inputs else 0,
        "new_tokens": len(new_ids),
        "token_ids": new_ids,
        "load_s": load_s,
        **stats,
    }


# --- a conversation ----------------------------------------------------------------------------------------------


def user_turns(stream: TextIO, first: str | None = None, ask: TextIO | None = None) -> Iterator[str]:
    """``first`` (when given), then one turn per line of ``stream`` until an empty line or end of input; ``ask``
    (an interactive terminal's stderr) gets a ``> `` prompt before each read."""
    if first:
        yield first
    while True:
        if ask is not None:
            ask.write("> ")
            ask.flush()
        line = stream.readline()
        text = line.rstrip("\r\n")
        if not text.strip():
            return
        yield text


def chat(directory: Path, turns: Iterable[str], *, trust_remote_code: bool = False, generation: dict[str, Any] | None = None,
         seed: int | None = None, stream: bool = True) -> dict[str, Any]:
    """Hold a conversation with the export in ``directory``: each user turn of ``turns`` (consumed lazily, so an
    interactive reader sees each reply before it is asked for the next turn) goes through the chat template with the
    conversation so far; with ``stream`` each reply is printed to stdout as it is generated. Returns the messages
    and each turn's tokens and timings."""
    import torch

    directory = Path(directory)
    _check_folder(directory)
    tokenizer = load_tokenizer(directory)
    if not getattr(tokenizer, "chat_template", None):
        raise UnsupportedError("--chat: the tokenizer in this folder has no chat template; drop --chat")
    exported, load_s = load_generation_export(directory, trust_remote_code)
    if seed is not None:
        torch.manual_seed(seed)
    generation = dict(generation or {})
    messages: list[dict[str, str]] = []
    records: list[dict[str, Any]] = []
    printer = TextPrinter(tokenizer) if stream else None
    for index, user in enumerate(turns, start=1):
        messages.append({"role": "user", "content": user})
        inputs = _encode(tokenizer, messages=messages)
        check_vocab(exported, inputs["input_ids"])
        try:
            new_ids, stats = _generate(exported, inputs, generation, printer)
        except UnsupportedError as e:
            raise UnsupportedError(f"chat turn {index} ({inputs['input_ids'].shape[-1]} prompt tokens): {e}") from e
        reply = tokenizer.decode(new_ids, skip_special_tokens=True)
        if stream and (generation.get("num_beams") or 1) > 1:  # not streamed: printed whole
            print(reply, flush=True)
        messages.append({"role": "assistant", "content": reply})
        records.append({"user": user, "text": reply, "prompt_tokens": inputs["input_ids"].shape[-1],
                        "new_tokens": len(new_ids), "token_ids": new_ids, **stats})
    return {"directory": str(directory), "load_s": load_s, "messages": messages, "turns": records}


# --- the command ---------------------------------------------------------------------------------------------------


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _summary(new_tokens: int, prompt_tokens: int, stats: dict[str, Any], load_s: float) -> str:
    decode = (f"decode {_fmt(stats['decode_tokens_per_s'], '.1f')} tok/s ({stats['decode_steps']} steps in "
              f"{stats['decode_s']:.3f} s)" if stats["decode_s"] is not None else
              f"generate {stats['generate_s']:.3f} s (beam search: no per-token timing)")
    return (f"{new_tokens} new tokens (prompt {prompt_tokens}): prefill {_fmt(stats['prefill_s'], '.3f')} s, "
            f"{decode}; load {load_s:.1f} s")


def cmd_run(args: argparse.Namespace) -> int:
    generation = generation_kwargs(args)  # refused flags fail here, before anything loads
    if args.chat:
        if args.image or args.audio is not None:
            raise UnsupportedError("--chat takes text turns only; for an image or audio prompt drop --chat")
        interactive = sys.stdin.isatty() and not args.json
        turns = user_turns(sys.stdin, args.prompt, ask=terminal() if interactive else None)
        result = chat(args.directory, turns, generation=generation, seed=args.seed, stream=not args.json,
                      trust_remote_code=args.trust_remote_code)
        if args.json:
            print(json.dumps(result, indent=2))
        elif result["turns"]:
            last = result["turns"][-1]
            print(f"[chat] {len(result['turns'])} turn(s); last: "
                  + _summary(last["new_tokens"], last["prompt_tokens"], last, result["load_s"]), file=terminal())
        return 0
    if args.prompt is None and not args.image and args.audio is None:
        raise UnsupportedError("pass --prompt TEXT (or --chat to read the conversation from standard input)")
    result = run(args.directory, args.prompt, generation=generation, seed=args.seed, images=args.image,
                 audio=args.audio, trust_remote_code=args.trust_remote_code)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(result["text"])
    print("[run] " + _summary(result["new_tokens"], result["prompt_tokens"], result, result["load_s"]),
          file=terminal())
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
        print(f"hfexport: error: {e}", file=terminal())
        return 2


if __name__ == "__main__":
    sys.exit(main())
