"""The ``hfexport`` command: export, env, demo, run, matrix.

Each stage prints as it finishes, with its wall time; ``--json`` prints one JSON object instead, for machines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

__all__ = ["main", "Progress"]


class Progress:
    """Times named stages and reports each one as it ends (to stderr, or collected for ``--json``)."""

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.stages: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[dict[str, Any]]:
        record: dict[str, Any] = {"stage": name, "detail": detail}
        if not self.quiet:
            print(f"[{name}] {detail}".rstrip(), file=sys.stderr, flush=True)
        start = time.perf_counter()
        try:
            yield record
        finally:
            record["seconds"] = round(time.perf_counter() - start, 3)
            self.stages.append(record)
            if not self.quiet:
                print(f"[{name}] done in {record['seconds']:.1f}s", file=sys.stderr, flush=True)


def _load_model(model_id: str, progress: Progress) -> tuple[Any, Any]:
    from .models.loading import load_model_and_processor

    from .errors import UnsupportedError

    with progress.stage("load", model_id) as rec:
        try:
            model, processor = load_model_and_processor(model_id)
        except (OSError, ValueError, KeyError) as e:
            raise UnsupportedError(
                f"cannot load the model {model_id!r}: {e}. Pass a local model folder (config.json + weights), or a "
                "Hub id while online."
            ) from e
        rec["architecture"] = type(model).__name__
    return model, processor


def cmd_export(args: argparse.Namespace) -> int:
    from .registry import AutoExportConfig
    from .models.loading import sample_inputs
    from .registry import AutoHfExporter

    from .quantizers.presets import cli_quantizer

    progress = Progress(quiet=args.json)
    make_quantizer = cli_quantizer(args.quantize, args.format, args.calibration)  # a bad pair fails before loading
    model, processor = _load_model(args.model, progress)
    config = AutoExportConfig.from_dict({"export_format": args.format, "dynamic": args.dynamic})
    if make_quantizer is not None:
        config.quantizer = make_quantizer(getattr(processor, "tokenizer", processor))
    exporter = AutoHfExporter.from_config(config)
    inputs = sample_inputs(model, processor)
    with progress.stage("trace", f"{args.format} ({'dynamic' if args.dynamic else 'static'} shapes)"):
        exported = exporter.export(model, inputs, config=config)
    with progress.stage("save", str(args.output)):
        exported.save_pretrained(args.output)
        if processor is not None and hasattr(processor, "save_pretrained"):
            processor.save_pretrained(args.output)
    with progress.stage("check", "outputs against eager PyTorch"):
        from .validation import compare_outputs

        report = compare_outputs(exported(**inputs), model(**inputs))
    summary = {
        "model": args.model,
        "architecture": type(model).__name__,
        "format": args.format,
        "output": str(args.output),
        "components": list(exported.components),
        "bytes": sum(p.stat().st_size for p in Path(args.output).rglob("*") if p.is_file()),
        "max_abs_diff": report["max_abs_diff"],
        "stages": progress.stages,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(
            f"exported {summary['architecture']} to {args.output} ({args.format}, {summary['bytes'] / 1e6:.1f} MB); "
            f"max abs diff vs eager: {summary['max_abs_diff']:.2e}"
        )
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from .env import main_env

    code = main_env(json_out=args.json)
    if args.workarounds:
        from .workarounds import workarounds

        rows = [w.describe() for w in workarounds()]
        if args.json:
            print(json.dumps({"workarounds": rows}, indent=2))
        else:
            print("\nworkarounds:" if rows else "\nworkarounds: none registered")
            for row in rows:
                state = "active" if row["active"] else "inactive (versions out of range)"
                print(f"  {row['id']} [{row['backend']}] {row['target']}: {row['breaks']} — {state}")
                if row["upstream"]:
                    print(f"      upstream: {row['upstream']}")
    return code


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(json_out=args.json, backends=args.backends)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hfexport", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("export", help="export a model folder (or Hub id) to a backend")
    p.add_argument("model", help="local model folder, or a Hub id when online")
    p.add_argument("--format", default="dynamo", choices=["dynamo", "onnx", "executorch", "openvino"])
    p.add_argument("--output", "-o", required=True, type=Path)
    p.add_argument("--dynamic", action="store_true", help="symbolic shapes (Dim.AUTO on every dim)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--quantize", choices=["pt2e-int8", "ort-dynamic", "ort-static", "nncf-int8", "nncf-int4"],
                   help="post-training quantization recipe (see hfexport.quantizers.presets)")
    p.add_argument("--calibration", type=Path, metavar="FILE",
                   help="JSONL of calibration prompts (a string, or an object with 'text', per line)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("env", help="installed vs tested versions, usable backends")
    p.add_argument("--json", action="store_true")
    p.add_argument("--workarounds", action="store_true", help="also list the registered workarounds")
    p.set_defaults(func=cmd_env)

    p = sub.add_parser("demo", help="export the packaged SmolLM2 and MiniLM and compare with eager")
    p.add_argument("--json", action="store_true")
    p.add_argument("--backends", nargs="*", default=None)
    p.set_defaults(func=cmd_demo)

    from .run_cli import add_run_parser

    add_run_parser(sub)

    from .matrix.command import add_matrix_parser

    add_matrix_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from .errors import HfExportError

    try:
        return args.func(args)
    except HfExportError as e:
        print(f"hfexport: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
