"""One matrix case, run in its own process:
``python -m hfexport.tools.matrix.worker MODEL_TYPE CLASS TASK BACKEND STAGE``.

Prints exactly one JSON line on stdout (anything the model prints goes to stderr) with the case's ``status``:

- ``pass``: the export's outputs match eager PyTorch within the backend's fp32 bound (export stage), or
  ``ExportedModel.generate`` gives eager ``model.generate``'s greedy tokens exactly (generate stage);
- ``mismatch``: it ran, but the numbers or tokens differ;
- ``fail``: the export or its run raised (``reason`` = exception type, first line, component and the innermost
  transformers source line when known);
- ``eager-fails``: the tiny model runs not even eagerly on the matrix's inputs (a gap of the matrix's recipes);
- ``no-inputs``: the matrix has no inputs that exercise the model (no recipe for its main input, or an image/audio
  model given text only, so the capture sees its encoder never called): a gap of the matrix, see :func:`no_inputs`;
- ``cannot-build``: the tiny config or model cannot be built (missing package, remote code, rules that do not fit);
- ``unavailable``: the backend is not part of this hfexport release.

The scheduler adds ``timeout`` when the process outlives its budget.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import time
import traceback
from typing import Any

from ...validation import FP32_ATOL

__all__ = ["TOLERANCES", "NEW_TOKENS", "no_inputs", "run_case", "stopped_early", "main"]

TOLERANCES = FP32_ATOL  # the one fp32 tolerance table
NEW_TOKENS = 8
MEMORY_GIB = 8
UNAVAILABLE = "backend not available in this release"


_MEDIA_INPUTS = ("pixel_values", "pixel_values_videos", "input_features", "input_values")


def no_inputs(failure: BaseException | str) -> bool:
    """Whether a failure (the exception, or its row's reason) is the matrix's own gap rather than the backend's:
    ``NoInputRecipe`` (``matrix: ...``), or the multimodal capture's "did not call [encoder]" with inputs that hold no
    image, video or audio (the matrix gave text only; the full input list is part of that message). An exception is
    read along its whole chain: the export wraps the capture's error, and the row's reason keeps 170 characters of
    each end only."""
    if isinstance(failure, BaseException):
        return any(_no_inputs_message(str(e)) for e in _chain(failure))
    if failure.startswith("matrix: "):
        return True
    return _no_inputs_message(failure) and "(capture/multimodal.py:" in failure


def _no_inputs_message(text: str) -> bool:
    return ("(**inputs) did not call [" in text and "(inputs: [" in text
            and not any(f"'{k}'" in text for k in _MEDIA_INPUTS))


def reason_of(exc: BaseException) -> str:
    """``Type: first line [component X] (models/x/modeling_x.py:123)``, then ``| cause: ...`` with the root of the
    exception chain when it is another exception (a wrapped ``ConversionError`` hides the missing op), one line."""
    root = _chain(exc)[-1]
    text = _one(exc)
    if root is not exc:
        return f"{text[:230]} | cause: {_one(root)[:170]}"
    return text[:300]


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (``__cause__``, else an unsuppressed ``__context__``)."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    return chain


def _one(exc: BaseException) -> str:
    plain = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # the ONNX exporter colours its messages
    lines = [line.strip() for line in plain.splitlines() if line.strip()]
    first = lines[0] if lines else ""
    if first.endswith(":") and len(lines) > 1:  # "invalid X (1 problem(s)):" says nothing without its first item
        first += " " + lines[1]
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    component = getattr(exc, "component", None)
    if component and f"{component!r}" not in text:
        text += f" [component {component}]"
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if ("/transformers/" in f.filename or "/hfexport/" in f.filename)
              and "/hfexport/tools/matrix/" not in f.filename]
    if frames:  # the innermost line of transformers or hfexport: where to look first
        where = frames[-1].filename.replace("\\", "/")
        where = where.split("/hfexport/")[-1] if "/hfexport/" in where else where.split("/transformers/")[-1]
        text += f" ({where}:{frames[-1].lineno})"
    return text


def _exporter_and_config(backend: str, dynamic: bool) -> tuple[Any, Any]:
    from ...errors import UnsupportedError
    from ...registry import config_class_for, exporter_class_for

    try:
        exporter = exporter_class_for(backend)()
    except UnsupportedError as e:
        if "not part of this hfexport release" in str(e):
            raise _Unavailable() from e
        raise
    return exporter, config_class_for(backend)(dynamic=dynamic)


class _Unavailable(Exception):
    pass


def _eager(model: Any, model_type: str, class_name: str, run: Any) -> tuple[Any, Any]:
    """``(model, run(model))``; when ``run`` (sample inputs and the eager call) raises, once more on the model of
    the shrinking rules' second try (a size field the plain rules do not name builds, but then disagrees with the
    others at run time), if that model differs. The first error is raised when the retry fails too."""
    from .shrink import build_model

    try:
        return model, run(model)
    except Exception as first:  # noqa: BLE001 - re-raised below unless the second try runs
        try:
            refit = build_model(model_type, class_name, fit=True)
            if refit is None:
                raise first
            return refit, run(refit)
        except Exception:  # noqa: BLE001
            raise first from None


def _export_stage(model: Any, model_type: str, backend: str, result: dict[str, Any], class_name: str = "") -> None:
    import torch

    from ...validation import compare_outputs
    from .inputs import NoInputRecipe, sample_inputs

    def run(m: Any) -> tuple[dict[str, Any], Any]:
        inputs = sample_inputs(m, model_type)
        with torch.no_grad():
            return inputs, m(**inputs)

    try:
        model, (inputs, eager) = _eager(model, model_type, class_name, run)
    except NoInputRecipe:
        raise
    except Exception as e:  # noqa: BLE001 - recorded, not raised: the matrix reports every case
        result.update(status="eager-fails", reason=reason_of(e))
        return
    exporter, config = _exporter_and_config(backend, dynamic=False)
    start = time.perf_counter()
    exported = exporter.export(model, inputs, config)
    result["export_seconds"] = round(time.perf_counter() - start, 2)
    with torch.no_grad():
        report = compare_outputs(exported(**inputs), eager)
    result["max_abs_diff"] = report["max_abs_diff"]
    bound = TOLERANCES.get(backend, 1e-4)
    if report["problems"]:
        result.update(status="mismatch", reason="; ".join(report["problems"])[:300])
    elif report["max_abs_diff"] > bound or report["max_abs_diff"] != report["max_abs_diff"]:
        worst = max(report["leaves"].items(), key=lambda kv: kv[1]["max_abs_diff"])[0]
        result.update(status="mismatch", reason=f"max abs diff {report['max_abs_diff']:.2e} > {bound:g} on {worst}")
    else:
        result["status"] = "pass"


def _generate_stage(model: Any, model_type: str, backend: str, result: dict[str, Any], class_name: str = "") -> None:
    import torch

    from .inputs import NoInputRecipe, sample_inputs
    from .overrides import GENERATE_ONE_ROW

    batch = 1 if model_type in GENERATE_ONE_ROW else 2

    def run(m: Any) -> tuple[dict[str, Any], dict[str, Any], Any, dict[str, int]]:
        capture = sample_inputs(m, model_type, batch=batch, seq=6, for_generation=True, new_tokens=NEW_TOKENS)
        prompt = sample_inputs(m, model_type, batch=batch, seq=9, for_generation=True, new_tokens=NEW_TOKENS)
        with torch.no_grad():
            expected, floor = m.generate(**prompt, max_new_tokens=NEW_TOKENS, do_sample=False), {}
            if stopped_early(m, prompt, expected):
                # a random tiny model may emit EOS at once (Florence-2's: [[2, 2], [2, 2]]): any export that stops
                # too would pass, so both sides generate NEW_TOKENS (min_new_tokens: transformers' processor)
                try:
                    expected, floor = m.generate(**prompt, max_new_tokens=NEW_TOKENS, do_sample=False,
                                                 min_new_tokens=NEW_TOKENS), {"min_new_tokens": NEW_TOKENS}
                except Exception as e:  # noqa: BLE001 - its own generate refuses the floor: compare what it gave
                    result["reason"] = f"eager stops before {NEW_TOKENS} tokens and refuses min_new_tokens ({e})"[:300]
            return capture, prompt, expected, floor

    try:
        model, (capture, prompt, expected, floor) = _eager(model, model_type, class_name, run)
    except NoInputRecipe:
        raise
    except Exception as e:  # noqa: BLE001
        result.update(status="eager-fails", reason=reason_of(e))
        return
    exporter, config = _exporter_and_config(backend, dynamic=True)
    start = time.perf_counter()
    exported = exporter.export_for_generation(model, capture, config)
    result["export_seconds"] = round(time.perf_counter() - start, 2)
    got = exported.generate(**prompt, max_new_tokens=NEW_TOKENS, **floor)
    if tuple(got.shape) != tuple(expected.shape):
        result.update(status="mismatch", mismatched_tokens=-1,
                      reason=f"token shape {tuple(got.shape)} != eager {tuple(expected.shape)}")
        return
    wrong = int((got != expected).sum())
    result["mismatched_tokens"] = wrong
    if wrong:
        first = int((got != expected).any(dim=0).nonzero()[0])
        result.update(status="mismatch", reason=f"{wrong} token(s) differ from eager greedy, first at position {first}")
    else:
        result["status"] = "pass"


def stopped_early(model: Any, prompt: dict[str, Any], sequences: Any) -> bool:
    """Whether eager ``generate`` returned fewer than :data:`NEW_TOKENS` new tokens (every row reached EOS)."""
    import torch

    if not isinstance(sequences, torch.Tensor):
        return False
    ids = prompt.get("input_ids")
    if getattr(model.config, "is_encoder_decoder", False) or not isinstance(ids, torch.Tensor):
        start = 1  # the decoder's start token
    else:
        start = ids.shape[-1]
    return sequences.shape[-1] - start < NEW_TOKENS


def run_case(model_type: str, class_name: str, task: str, backend: str, stage: str) -> dict[str, Any]:
    """Run one case in this process and return its result row."""
    result: dict[str, Any] = {"model_type": model_type, "class_name": class_name, "task": task, "backend": backend,
                              "stage": stage, "status": "fail", "max_abs_diff": None, "mismatched_tokens": None,
                              "export_seconds": None, "reason": ""}
    try:
        import torch

        torch.manual_seed(0)
        from .shrink import build_model

        model = build_model(model_type, class_name)
    except Exception as e:  # noqa: BLE001
        result.update(status="cannot-build", reason=reason_of(e))
        return result
    try:
        from .inputs import NoInputRecipe

        (_generate_stage if stage == "generate" else _export_stage)(model, model_type, backend, result, class_name)
    except _Unavailable:
        result.update(status="unavailable", reason=UNAVAILABLE)
    except NoInputRecipe as e:
        result.update(status="no-inputs", reason=f"matrix: {e}")
    except Exception as e:  # noqa: BLE001
        result.update(status="no-inputs" if no_inputs(e) else "fail", reason=reason_of(e))
    return result


def _limit_memory(gib: int = MEMORY_GIB) -> None:
    """Cap this process's heap, so one architecture the shrinking rules missed fails alone instead of taking the
    machine's memory from everything else running on it (an over-large tiny build hit the OOM killer at 22 GB)."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        limit = gib << 30
        if soft == resource.RLIM_INFINITY or soft > limit:
            resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ImportError, ValueError, OSError):  # not POSIX, or a lower limit already set
        pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 5:
        print(__doc__.splitlines()[0], file=sys.stderr)
        return 2
    _limit_memory()
    with contextlib.redirect_stdout(sys.stderr):
        result = run_case(*args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
