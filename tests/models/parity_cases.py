"""Shared pieces of the per-backend parity tests: the tiny architectures, their shapes, one export per case, and the
checks of an export's outputs against eager PyTorch (on the export's shapes, on other shapes, after a reload)."""

from __future__ import annotations

from typing import Any, Callable

import torch

from hfexport import ExportedModel
from hfexport.testing.tiny import TINY_CASES
from hfexport.validation import compare_outputs

CASES = ["llama", "qwen3", "gpt2", "gemma3", "mixtral", "qwen3_moe", "bert", "t5", "vit", "whisper", "mamba"]
# in the default suite: a decoder, a sliding-window decoder and an encoder-decoder; the other families run in the
# sweep (make test-sweep) and in every backend's matrix rows, for the default suite's time (each case is an export)
DEFAULT_CASES = ("llama", "gemma3", "t5")


def case_params(cases: list) -> list:
    """``cases`` (a family name, or a tuple starting with one) as pytest params, those outside
    :data:`DEFAULT_CASES` marked ``sweep``."""
    import pytest

    return [pytest.param(c, marks=[] if (c[0] if isinstance(c, tuple) else c) in DEFAULT_CASES
                         else [pytest.mark.sweep]) for c in cases]
# (batch, seq) of the export sample, of the "other shape" run and of the reload run. Gemma3's returned
# sliding-window cache keeps the last window-1 positions, a different graph below that length, so its shapes
# stay above the window (8).
SHAPES = {"gemma3": ((2, 10), (3, 12), (1, 9))}
DEFAULT_SHAPES = ((2, 7), (3, 10), (1, 5))
# T5's tiny config (initializer_factor=3) is ill-conditioned: eager fp32 itself is ~1e-3 away from fp64 on its
# logits. For it the export must be at least as close to the fp64 result as eager fp32 is.
ILL_CONDITIONED = {"t5"}


def shapes(name: str, table: dict = SHAPES) -> tuple:
    """The (export, other, reload) shapes of case ``name``: ``table``'s entry, else the defaults."""
    return table.get(name, DEFAULT_SHAPES)


def export_case(name: str, export: Callable[[Any, dict], Any], tmp_path_factory: Any, folder: str | None = None,
                table: dict = SHAPES) -> tuple:
    """The tiny case ``name`` built and exported by ``export(model, inputs)`` on its export shape: the tuple
    ``(name, case, model, exported, tmp)`` that the checks below take (``tmp``: a fresh folder for the reload)."""
    case = TINY_CASES[name]
    model = case.build()
    exported = export(model, case.inputs(*shapes(name, table)[0]))
    return name, case, model, exported, tmp_path_factory.mktemp(folder or name)


def check(name: str, exported_outputs: Any, model: Any, inputs: dict, tol: float) -> dict:
    """Every output leaf within ``tol`` (max abs diff) of eager's, or for an ill-conditioned case as close to fp64 as
    eager fp32 is, up to a factor 2: another fp32 summation order is as accurate on average, not on every draw (tiny
    T5 on OpenVINO, Intel Xeon with AVX-512, batch 3 x 10: 1.53e-3 from fp64 where eager is 1.37e-3); the
    comparison report."""
    with torch.no_grad():
        eager = model(**inputs)
    report = compare_outputs(exported_outputs, eager)
    assert not report["problems"], report["problems"]
    assert report["leaves"], "no output leaf was compared"
    if name in ILL_CONDITIONED:
        with torch.no_grad():
            exact = TINY_CASES[name].build().double()(**inputs)
        eager_error = compare_outputs(eager, exact)["max_abs_diff"]
        assert compare_outputs(exported_outputs, exact)["max_abs_diff"] <= max(tol, 2 * eager_error), report["leaves"]
        return report
    assert report["max_abs_diff"] <= tol, report["leaves"]
    return report


def check_same_inputs(exported_case: tuple, tol: float, table: dict = SHAPES) -> dict:
    """On the export's own shapes: the model's own output type, and the outputs match eager's."""
    name, case, model, exported, _ = exported_case
    inputs = case.inputs(*shapes(name, table)[0])
    out = exported(**inputs)
    assert type(out) is type(model(**inputs)), "the export must return the model's own output type"
    return check(name, out, model, inputs, tol)


def check_other_shapes(exported_case: tuple, tol: float, table: dict = SHAPES) -> dict:
    """On another batch size and sequence length than the export's: the outputs match eager's."""
    name, case, model, exported, _ = exported_case
    export_shape, other_shape, _ = shapes(name, table)
    inputs = case.inputs(*other_shape)
    first = next(iter(inputs))
    assert inputs[first].shape != case.inputs(*export_shape)[first].shape
    return check(name, exported(**inputs), model, inputs, tol)


def check_reload(exported_case: tuple, tol: float, table: dict = SHAPES) -> Any:
    """Saved to the case's folder and loaded back: the outputs match eager's and the metadata is the export's.
    Returns the reloaded ``ExportedModel`` (the files are in ``exported_case[4]``)."""
    name, case, model, exported, tmp = exported_case
    exported.save_pretrained(tmp)
    reloaded = ExportedModel.from_pretrained(tmp)
    inputs = case.inputs(*shapes(name, table)[2])
    check(name, reloaded(**inputs), model, inputs, tol)
    assert reloaded.components["model"].metadata.to_dict() == exported.components["model"].metadata.to_dict()
    return reloaded
