"""``hfexport validate DIR --model MODEL``: an export against its eager source model, leaf by leaf and token by token.

Loads the export folder, the eager model (and its tokenizer, when the folder has one) and the CLI's sample inputs,
runs :func:`hfexport.validate` and prints its report: a summary line and one line per failing output leaf or
generated row, or one JSON object with ``--json``. The exit status is 0 when every leaf is within its tolerance and
every token matches, 1 when any differs, 2 when the export or the model cannot be loaded.

Example:
    $ hfexport validate exported/ --model ./tiny-llama --json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .run import add_trust_flag

__all__ = ["add_validate_parser", "cmd_validate"]


def add_validate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``validate`` subcommand on ``subparsers`` (from ``parser.add_subparsers()``)."""
    p = subparsers.add_parser(
        "validate",
        help="compare an export with its eager model: every output leaf, and generation token for token",
        description="Compare an exported folder with the eager model it came from; exit 1 when anything differs.",
    )
    p.add_argument("directory", type=Path, help="folder written by save_pretrained (or hfexport export)")
    p.add_argument("--model", required=True, help="the source model: a local model folder, or a Hub id when online")
    p.add_argument("--atol", type=float, default=None,
                   help="absolute tolerance for every float leaf (default: by dtype and backend; fp32 1e-4 for "
                        "Dynamo and ONNX, 1e-3 for ExecuTorch and OpenVINO)")
    p.add_argument("--rtol", type=float, default=None, help="relative tolerance for every float leaf (default 0 "
                                                            "for fp32)")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens the generation check decodes (default: past the sliding window, within the cache)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_trust_flag(p)
    p.set_defaults(func=cmd_validate)
    return p


def _load(args: argparse.Namespace) -> tuple[Any, Any, dict[str, Any]]:
    from ..errors import UnsupportedError
    from ..exported import ExportedModel
    from .loading import load_model_and_processor, sample_inputs

    # a ManifestError names what is wrong with the folder
    exported = ExportedModel.from_pretrained(args.directory, trust_remote_code=args.trust_remote_code)
    try:
        model, processor = load_model_and_processor(args.model)
    except (OSError, ValueError, KeyError) as e:
        raise UnsupportedError(
            f"cannot load the model {args.model!r}: {e}. Pass the model folder (config.json + weights) the export "
            "came from, or its Hub id while online."
        ) from e
    try:
        inputs = sample_inputs(model, processor)
    except ValueError as e:
        raise UnsupportedError(f"{e} (hfexport.validate(exported, model, inputs) takes your own inputs)") from e
    return exported, model, inputs


def cmd_validate(args: argparse.Namespace) -> int:
    """Run the check; returns the exit status (0 passed, 1 a leaf or token differs). Load errors raise
    :class:`~hfexport.errors.HfExportError`, which the ``hfexport`` command turns into status 2."""
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        from ..errors import ConfigError

        raise ConfigError("hfexport validate", [f"--max-new-tokens must be at least 1, got {args.max_new_tokens}"])
    exported, model, inputs = _load(args)
    from ..validation import validate

    generate = {"max_new_tokens": args.max_new_tokens} if args.max_new_tokens is not None else None
    if "model" in exported.components:
        generate = None  # a single graph has no generation check; --max-new-tokens has nothing to do
    report = validate(exported, model, inputs, generate=generate, atol=args.atol, rtol=args.rtol)
    if args.json:
        print(json.dumps({"directory": str(args.directory), "model": args.model, **report.to_dict()}, indent=2))
    else:
        print(report)
    return 0 if report.passed else 1
