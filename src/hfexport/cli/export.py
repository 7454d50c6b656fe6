"""``hfexport export MODEL --format F --output DIR``: load, export (each of its stages timed), save, and validate
against eager PyTorch.

A model that generates (``model.can_generate()``: the text-generation, text2text, speech and image-text-to-text
tasks) is exported for generation by default (``export_for_generation``: the components ``hfexport run`` serves), and
the output says so; ``--no-for-generation`` exports its forward as one graph. The task comes from the model's class
and can be overridden with ``--task``. Every option is checked before the model loads. The folder gets the
tokenizer / processor (and its chat template) beside the export.

Example:
    $ hfexport export ./tiny-llama --format onnx --output out --static-cache 256 --multi-token
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from .progress import Progress
from .quiet import terminal

__all__ = ["add_export_parser", "cmd_export"]

FORMATS = ("dynamo", "onnx", "executorch", "openvino", "aoti")
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
# hfexport.quantizers.presets.RECIPES, spelled out: importing the quantizers would load torch, and --help must not
# (tests/test_cli.py); tests/test_quantizers.py checks that the two lists are the same
RECIPES = (
    "pt2e-int8", "ort-dynamic", "ort-static", "ort-int8", "ort-int4", "nncf-int8", "nncf-int8-weights", "nncf-int4",
    "hqq-int4", "int8-groups", "torchao-8da4w",
)
VALIDATE_TOKENS = 8  # greedy tokens compared with eager model.generate after a for-generation export


def add_export_parser(subparsers: Any) -> argparse.ArgumentParser:
    from .tasks import TASKS

    p = subparsers.add_parser("export", help="export a model folder (or Hub id) to a backend",
                              description=__doc__.split("\n\n")[1].replace("\n", " ").replace("``", ""))
    p.add_argument("model", help="local model folder, or a Hub id when online")
    p.add_argument("--format", default="dynamo", choices=FORMATS)
    p.add_argument("--output", "-o", required=True, type=Path)
    p.add_argument("--task", choices=list(TASKS), metavar="TASK",
                   help=f"what to export the model for (default: from its class): {', '.join(TASKS)}")
    p.add_argument("--for-generation", action=argparse.BooleanOptionalAction, default=None,
                   help="export the generation components (default: yes for a model that generates)")
    p.add_argument("--static-cache", type=int, metavar="N",
                   help="export against a static KV cache of N positions (default: a dynamic cache)")
    p.add_argument("--multi-token", action="store_true",
                   help="one decode graph that takes several tokens (the prompt too, with --static-cache, or "
                        "on a stateful OpenVINO export)")
    p.add_argument("--logits-to-keep-input", action="store_true",
                   help="with --multi-token: the decode graph takes logits_to_keep, the positions whose logits it "
                        "returns, so that generate() projects a prompt's last position only (as eager does)")
    p.add_argument("--dynamic", action=argparse.BooleanOptionalAction, default=None,
                   help="symbolic shapes, Dim.AUTO on every dim (default: on for generation, off for one graph)")
    p.add_argument("--dtype", choices=list(DTYPES), default="fp32", help="the weights' dtype (default: fp32)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where to trace (default: cpu)")
    p.add_argument("--ort-fusions", choices=["cpu", "cuda", "webgpu", "dml"],
                   help="ONNX only: fuse into ONNX Runtime's contrib ops for that execution provider")
    p.add_argument("--quantize", choices=RECIPES,
                   help="post-training quantization recipe (see hfexport.quantizers.presets)")
    p.add_argument("--calibration", type=Path, metavar="FILE",
                   help="JSONL of calibration prompts (a string, or an object with 'text', per line)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_export)
    return p


def _check_options(args: argparse.Namespace) -> None:
    """What can be refused before the model loads."""
    from ..errors import UnsupportedError

    problems = []
    if args.static_cache is not None and args.static_cache < 1:
        problems.append(f"--static-cache must be a positive number of positions, got {args.static_cache}")
    if args.for_generation is False and (args.static_cache is not None or args.multi_token):
        problems.append("--static-cache and --multi-token shape the generation components: drop "
                        "--no-for-generation")
    if args.logits_to_keep_input and not args.multi_token:
        problems.append("--logits-to-keep-input is an input of the multi-token decode graph: add --multi-token")
    if args.multi_token and args.dynamic is False:
        problems.append("--multi-token needs a dynamic query axis: drop --no-dynamic")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            problems.append("--device cuda: this machine has no CUDA device (torch.cuda.is_available() is False)")
    if args.ort_fusions is not None and args.format != "onnx":
        problems.append(f"--ort-fusions is an ONNX Runtime option; drop it for --format {args.format}")
    if args.output.exists() and not args.output.is_dir():
        problems.append(f"--output {args.output} exists and is not a folder")
    if problems:
        raise UnsupportedError("; ".join(problems))


def _load_model(args: argparse.Namespace, progress: Progress) -> tuple[Any, Any]:
    import torch

    from ..errors import UnsupportedError
    from .loading import load_model_and_processor

    with progress.stage("load", args.model) as rec:
        try:
            model, processor = load_model_and_processor(
                args.model, task=args.task, dtype=getattr(torch, DTYPES[args.dtype]), device=args.device)
        except (OSError, ValueError, KeyError) as e:
            raise UnsupportedError(
                f"cannot load the model {args.model!r}: {e}. Pass a local model folder (config.json + weights), or "
                "a Hub id while online."
            ) from e
        rec["architecture"] = type(model).__name__
    return model, processor


def _cache_settings(args: argparse.Namespace) -> Any:
    """The cache settings asked for, as a generation config the exporter merges into the model's own (its eos, pad
    and decoder-start ids stay); None for the model's own as it is (a dynamic cache)."""
    if args.static_cache is None:
        return None
    from transformers import GenerationConfig

    return GenerationConfig(cache_implementation="static", max_cache_len=args.static_cache)


def cmd_export(args: argparse.Namespace) -> int:
    from ..quantizers.presets import cli_quantizer
    from ..registry import AutoExportConfig, AutoHfExporter
    from .loading import sample_inputs
    from .tasks import GENERATIVE_TASKS, detect_task

    _check_options(args)
    progress = Progress(quiet=args.json)
    make_quantizer = cli_quantizer(args.quantize, args.format, args.calibration)  # a bad pair fails before loading
    model, processor = _load_model(args, progress)
    task = args.task or detect_task(model.config)
    for_generation = args.for_generation
    if for_generation is None:
        for_generation = task in GENERATIVE_TASKS and model.can_generate()
        if for_generation:
            progress.note(f"{type(model).__name__} generates ({task}): exporting its generation components "
                          "(--no-for-generation exports one forward graph)")
    dynamic = args.dynamic if args.dynamic is not None else for_generation
    options = {"ort_fusions": args.ort_fusions} if args.ort_fusions else {}
    config = AutoExportConfig.from_dict({"export_format": args.format, "dynamic": dynamic, **options})
    if make_quantizer is not None:
        config.quantizer = make_quantizer(getattr(processor, "tokenizer", processor))
    exporter = AutoHfExporter.from_config(config)
    exporter.on_stage = progress.record  # each stage of the export (capture, trace, lower, ...) as it ends
    exporter.on_stage_start = progress.started
    inputs = sample_inputs(model, processor)
    if args.format == "executorch" and for_generation and args.static_cache is not None:
        # its static cache is kept as state in the program: buffers of one fixed batch, and on device that is 1
        inputs = {k: v[:1] if hasattr(v, "shape") else v for k, v in inputs.items()}
        progress.note("ExecuTorch keeps the static cache inside the program, at a fixed batch: traced with batch 1")
    gen = _cache_settings(args)
    with progress.stage("export", f"{args.format} ({'dynamic' if dynamic else 'static'} shapes"
                        + (", for generation" if for_generation else "") + ")"):
        if for_generation:
            exported = exporter.export_for_generation(model, inputs, config, generation_config=gen,
                                                      multi_token_decode=args.multi_token,
                                                      logits_to_keep_input=args.logits_to_keep_input)
        else:
            exported = exporter.export(model, inputs, config=config)
    with progress.stage("save", str(args.output)):
        exported.save_pretrained(args.output)
        if processor is not None and hasattr(processor, "save_pretrained"):
            processor.save_pretrained(args.output)
    with progress.stage("validate", "against eager PyTorch"):
        check, report = _validate(exported, model, inputs, for_generation)
    summary = {
        "model": args.model,
        "architecture": type(model).__name__,
        "task": task,
        "format": args.format,
        "for_generation": for_generation,
        "static_cache": args.static_cache,
        "multi_token": args.multi_token,
        "output": str(args.output),
        "components": list(exported.components),
        "bytes": sum(p.stat().st_size for p in Path(args.output).rglob("*") if p.is_file()),
        **check,
        "stages": progress.stages,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        result = (f"max abs diff vs eager: {summary['max_abs_diff']:.2e}" if "max_abs_diff" in check else
                  f"greedy tokens {'equal' if check['same_tokens'] else 'DIFFER from'} eager model.generate's "
                  f"({VALIDATE_TOKENS} new tokens, {check['on']})")
        result += "" if check["passed"] else " — VALIDATION FAILED (see above)"
        print(f"exported {summary['architecture']} to {args.output} ({args.format}, {summary['bytes'] / 1e6:.1f} MB, "
              f"components: {', '.join(summary['components'])}); {result}")
    if not check["passed"]:
        print(str(report), file=terminal())
    return 0 if check["passed"] else 1


def _validate(exported: Any, model: Any, inputs: dict, for_generation: bool) -> tuple[dict[str, Any], Any]:
    """``hfexport.validate``: every output leaf against eager's, or greedy generation token for token (and the
    teacher-forced logits of a decoder)."""
    from ..validation import validate

    if not for_generation:
        report = validate(exported, model, inputs)
        worst = max((leaf.max_abs_diff for leaf in report.leaves.values()), default=0.0)
        return {"passed": report.passed, "max_abs_diff": worst}, report
    report = validate(exported, model, inputs, generate={"max_new_tokens": VALIDATE_TOKENS})
    same = report.generation is None or report.generation.passed
    rows = 0 if report.generation is None else len(report.generation.eager_tokens)
    padded = report.generation is not None and rows == 2 and not report.generation.notes
    return {"passed": report.passed, "same_tokens": same, "new_tokens": VALIDATE_TOKENS,
            "on": "a left-padded batch of 2" if padded else f"the sample inputs ({rows} row(s))"}, report
