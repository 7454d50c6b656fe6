"""``hfexport bench DIR``: load time, prefill ms, decode tokens/s and peak RSS of an exported generation folder,
optionally against eager PyTorch in the same run.

The prompt is ``--prompt-len`` tokens: a fixed English text through the tokenizer saved in the folder (repeated and
cut to length), or seeded random ids within the model's vocabulary when the folder holds no tokenizer. Each round
generates exactly ``--new-tokens`` greedy tokens (``min_new_tokens`` keeps an early end-of-sequence from shortening a
round), timed by the streamer that ``hfexport run`` uses: prefill is the time to the first token, decode tokens/s
counts the tokens after it. One warm-up round, then ``--repeats`` rounds; the best and the median are reported.

With ``--eager MODEL`` the eager model runs the same prompt in the same rounds, interleaved with the export (and the
order flipped every round), so that a change of load on the machine hits both; the report gives the speed-ups and
whether the greedy tokens are the same.

Example:
    $ hfexport bench exported/ --prompt-len 64 --new-tokens 32 --eager ./smollm2 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from .quiet import terminal

from ..errors import HfExportError, UnsupportedError
from .run import add_trust_flag, check_vocab, has_tokenizer, load_generation_export, load_tokenizer, vocab_size
from .timing import best_and_median, peak_rss_mb, timed_generate

__all__ = ["add_bench_parser", "cmd_bench", "bench", "main"]

_TEXT = ("The quick brown fox jumps over the lazy dog while the busy town wakes up, and the baker opens the shop "
         "to sell warm bread to the first people on their way to work. ")


def add_bench_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``bench`` subcommand on ``subparsers`` (from ``parser.add_subparsers()``)."""
    p = subparsers.add_parser(
        "bench",
        help="prefill ms, decode tok/s and peak RSS of an exported generation folder (optionally vs eager)",
        description="Time an export_for_generation folder: load, prefill, decode, peak memory.",
    )
    p.add_argument("directory", type=Path, help="folder written by save_pretrained (export_for_generation)")
    p.add_argument("--prompt-len", type=int, default=32, help="prompt length in tokens (default: 32)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens generated per round (default: 32)")
    p.add_argument("--repeats", type=int, default=5, help="timed rounds after one warm-up (default: 5)")
    p.add_argument("--eager", metavar="MODEL", default=None,
                   help="a model folder (or Hub id when online) to time eager model.generate against, same rounds")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_trust_flag(p)
    p.set_defaults(func=cmd_bench)
    return p


def _check_args(args: argparse.Namespace) -> None:
    problems = []
    if args.prompt_len < 1:
        problems.append(f"--prompt-len must be at least 1, got {args.prompt_len}")
    if args.new_tokens < 2:
        problems.append(f"--new-tokens must be at least 2 (decode is timed after the first token), "
                        f"got {args.new_tokens}")
    if args.repeats < 1:
        problems.append(f"--repeats must be at least 1, got {args.repeats}")
    if problems:
        raise UnsupportedError("; ".join(problems))


def _prompt(directory: Path, exported: Any, prompt_len: int) -> tuple[dict[str, Any], str]:
    import torch

    if has_tokenizer(directory):
        tokenizer = load_tokenizer(directory)
        ids: list[int] = []
        while len(ids) < prompt_len:
            ids += tokenizer(_TEXT, add_special_tokens=False)["input_ids"]
        input_ids = torch.tensor([ids[:prompt_len]], dtype=torch.long)
        source = "tokenizer"
    else:
        vocab = vocab_size(exported)
        if vocab is None:
            raise UnsupportedError(f"{directory} has no tokenizer and its config no vocab_size: cannot build a prompt")
        input_ids = torch.randint(0, vocab, (1, prompt_len), generator=torch.Generator().manual_seed(0))
        source = "random"
    check_vocab(exported, input_ids)
    return {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids)}, source


def _eos_pad(config: Any) -> dict[str, Any]:
    """The ids both sides agree on, so eager prints no 'Setting pad_token_id' notice and both stop the same way."""
    if config is None:
        return {}
    eos = getattr(config, "eos_token_id", None)
    pad = getattr(config, "pad_token_id", None)
    pad = pad if pad is not None else (eos[0] if isinstance(eos, list) else eos)
    return {} if pad is None else {"pad_token_id": pad}


def _summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    prefill = [r["prefill_s"] * 1e3 if r["prefill_s"] is not None else None for r in rounds]
    decode = [r["decode_tokens_per_s"] for r in rounds]
    prefill_best, prefill_median = best_and_median(prefill, higher_is_better=False)
    decode_best, decode_median = best_and_median(decode, higher_is_better=True)
    return {"prefill_ms_best": prefill_best, "prefill_ms_median": prefill_median,
            "decode_tok_s_best": decode_best, "decode_tok_s_median": decode_median}


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def bench(directory: Path, *, prompt_len: int = 32, new_tokens: int = 32, repeats: int = 5,
          eager: str | None = None, trust_remote_code: bool = False) -> dict[str, Any]:
    """Time the export in ``directory`` (and ``eager``'s model, interleaved); returns the JSON report as a dict."""
    import torch

    directory = Path(directory)
    exported, load_s = load_generation_export(directory, trust_remote_code)
    inputs, source = _prompt(directory, exported, prompt_len)
    generation = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}

    def run_exported() -> tuple[list[int], dict[str, Any]]:
        return timed_generate(exported.generate, dict(inputs), **generation)

    sides = {"exported": run_exported}
    eager_load_s = None
    rss_export = None
    if eager is not None:
        from .loading import load_model_and_processor

        rss_export = peak_rss_mb()  # before the eager model is loaded beside it
        start = time.perf_counter()
        try:
            model, _ = load_model_and_processor(eager)
        except (OSError, ValueError, KeyError, TypeError, ImportError) as e:
            raise UnsupportedError(f"--eager {eager}: cannot load the model: {type(e).__name__}: {e}") from e
        eager_load_s = time.perf_counter() - start
        eager_generation = {**generation, **_eos_pad(model.generation_config)}

        def run_eager() -> tuple[list[int], dict[str, Any]]:
            with torch.no_grad():
                return timed_generate(model.generate, dict(inputs), **eager_generation)

        sides["eager"] = run_eager
    tokens: dict[str, list[list[int]]] = {name: [] for name in sides}
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    order = list(sides)
    for index in range(repeats + 1):  # round 0 is the warm-up
        for name in order if index % 2 else order[::-1]:
            new_ids, stats = sides[name]()
            tokens[name].append(new_ids)
            if index:
                rounds[name].append({k: stats[k] for k in ("prefill_s", "decode_steps", "decode_tokens_per_s")})
    report: dict[str, Any] = {
        "directory": str(directory),
        "format": str(exported.export_format),
        "prompt_tokens": int(inputs["input_ids"].shape[-1]),
        "prompt_source": source,
        "new_tokens": len(tokens["exported"][0]),
        "repeats": repeats,
        "load_s": load_s,
        **_summary(rounds["exported"]),
        "peak_rss_mb": peak_rss_mb(),
        "peak_rss_mb_before_eager": rss_export,
        "eager": None,
        "decode_speedup": None,
        "prefill_speedup": None,
        "same_tokens": None,
        "rounds": rounds,
    }
    if eager is not None:
        eager_summary = {"model": str(eager), "load_s": eager_load_s, **_summary(rounds["eager"])}
        report["eager"] = eager_summary
        report["decode_speedup"] = _ratio(report["decode_tok_s_median"], eager_summary["decode_tok_s_median"])
        report["prefill_speedup"] = _ratio(eager_summary["prefill_ms_median"], report["prefill_ms_median"])
        reference = tokens["eager"][0]
        report["same_tokens"] = all(t == reference for name in sides for t in tokens[name])
    return report


def _num(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _table(report: dict[str, Any]) -> str:
    lines = [
        f"bench {report['directory']} ({report['format']}): prompt {report['prompt_tokens']} tokens "
        f"({report['prompt_source']}), {report['new_tokens']} new tokens, {report['repeats']} rounds after a warm-up",
        f"{'':10} {'load s':>8} {'prefill ms best':>16} {'median':>8} {'decode tok/s best':>18} {'median':>8}",
    ]
    rows = [("exported", report)] + ([("eager", report["eager"])] if report["eager"] else [])
    for name, row in rows:
        lines.append(f"{name:10} {_num(row['load_s'], '.2f'):>8} {_num(row['prefill_ms_best'], '.2f'):>16} "
                     f"{_num(row['prefill_ms_median'], '.2f'):>8} {_num(row['decode_tok_s_best'], '.1f'):>18} "
                     f"{_num(row['decode_tok_s_median'], '.1f'):>8}")
    if report["eager"]:
        same = {True: "yes", False: "NO"}[bool(report["same_tokens"])]
        lines.append(f"export vs eager (medians): decode x{_num(report['decode_speedup'], '.2f')}, prefill "
                     f"x{_num(report['prefill_speedup'], '.2f')}; same greedy tokens: {same}")
    lines.append(f"peak RSS {_num(report['peak_rss_mb'], '.0f')} MB"
                 + (f" ({_num(report['peak_rss_mb_before_eager'], '.0f')} MB before the eager model loaded)"
                    if report["eager"] else ""))
    return "\n".join(lines)


def cmd_bench(args: argparse.Namespace) -> int:
    _check_args(args)
    report = bench(args.directory, prompt_len=args.prompt_len, new_tokens=args.new_tokens, repeats=args.repeats,
                   eager=args.eager, trust_remote_code=args.trust_remote_code)
    print(json.dumps(report, indent=2) if args.json else _table(report))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m hfexport.cli.bench DIR ...``: the ``bench`` subcommand on its own (``bench`` may be omitted)."""
    parser = argparse.ArgumentParser(prog="hfexport")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv if argv[:1] == ["bench"] else ["bench", *argv])
    try:
        return args.func(args)
    except HfExportError as e:  # as `hfexport bench` will report it
        print(f"hfexport: error: {e}", file=terminal())
        return 2


if __name__ == "__main__":
    sys.exit(main())
