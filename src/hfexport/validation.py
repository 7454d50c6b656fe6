"""Parity with eager PyTorch: every output leaf of an export against the source model's, and generation token for
token.

:func:`validate` is the check a user runs (and ``hfexport validate DIR --model MODEL`` prints): it returns a
:class:`ValidationReport` that says, per output leaf, the max abs / rel difference, the tolerance it was held to and
whether it passed, and for an ``export_for_generation`` export whether greedy generation gives eager's tokens.
:func:`compare_outputs` is the bare per-leaf numbers, for callers that judge them themselves.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from .errors import UnsupportedError
from .pytrees import get_leaf_tensors

__all__ = ["validate", "ValidationReport", "LeafReport", "GenerationReport", "tolerance", "compare_outputs"]

#: fp32 absolute tolerance per backend (the bar of the support matrix and the demo); rtol is 0 for fp32
FP32_ATOL = {"dynamo": 1e-4, "onnx": 1e-4, "aoti": 1e-4, "executorch": 1e-3, "openvino": 1e-3}
#: ``(atol, rtol)`` for the half-precision dtypes, whatever the backend (a few units in their last place)
HALF_TOLERANCE = {torch.float16: (1e-2, 1e-2), torch.bfloat16: (5e-2, 5e-2)}
#: new tokens of the generation check when the model has no sliding window to decode past
DEFAULT_NEW_TOKENS = 16
#: the generation check never decodes more than this many tokens (a 4096-token window is not decoded past)
MAX_NEW_TOKENS = 256
#: tokens decoded past the end of the sliding window
PAST_WINDOW = 8


def tolerance(dtype: torch.dtype, backend: str = "dynamo", quantized: bool = False) -> tuple[float, float] | None:
    """``(atol, rtol)`` a leaf of ``dtype`` is held to: ``|export - eager| <= atol + rtol * |eager|`` elementwise.

    ======================  ==========================================  =======
    leaf dtype              atol                                        rtol
    ======================  ==========================================  =======
    float32 / float64       1e-4 (Dynamo, ONNX, AOTI; other backends),  0
                            1e-3 (ExecuTorch, OpenVINO)
    float16                 1e-2                                        1e-2
    bfloat16                5e-2                                        5e-2
    integer / bool          equal (0)                                   0
    ======================  ==========================================  =======

    ``None`` for a float leaf of a quantized export: its numbers are reported, not judged, unless the caller gives a
    tolerance (quantization error is a choice the user made, with no bar that fits every recipe).

    Example:
        >>> tolerance(torch.float32, "openvino")
        (0.001, 0.0)
    """
    if not (dtype.is_floating_point or dtype.is_complex):
        return 0.0, 0.0
    if quantized:
        return None
    if dtype in HALF_TOLERANCE:
        return HALF_TOLERANCE[dtype]
    return FP32_ATOL.get(backend, 1e-4), 0.0


# --- reports -----------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class LeafReport:
    """One output leaf compared with eager's: the worst differences, the tolerance, and the verdict.

    ``max_abs_diff`` is NaN where NaNs sit in one output and not the other; ``atol``/``rtol`` are ``None`` for a leaf
    that was reported but not judged (a float leaf of a quantized export with no tolerance given).
    """

    name: str
    dtype: str
    shape: list[int]
    max_abs_diff: float
    max_rel_diff: float
    atol: float | None
    rtol: float | None
    passed: bool

    def to_dict(self) -> dict[str, Any]:
        return {k: _json_float(v) for k, v in dataclasses.asdict(self).items()}

    def describe(self) -> str:
        if self.atol is None:
            bound = "(not judged)"
        else:
            bound = f"atol {self.atol:g}" + (f" + rtol {self.rtol:g}" if self.rtol else "")
        verdict = "within" if self.passed else "exceeds"
        return (f"{self.name}: max abs diff {self.max_abs_diff:.3g} {verdict} {bound} (max rel diff "
                f"{self.max_rel_diff:.3g}) [{self.dtype}, {tuple(self.shape)}]")


@dataclasses.dataclass
class GenerationReport:
    """Greedy generation of the export against eager ``model.generate`` on the same prompts.

    ``first_difference[row]`` is the index, among that row's new tokens, of the first one that differs (``None``
    when the row matches); a row that ends earlier than eager's differs at its end. ``prompt_lengths`` are the
    unpadded lengths; the batch is left-padded to the longest.
    """

    passed: bool
    max_new_tokens: int
    prompt_lengths: list[int]
    eager_tokens: list[list[int]]
    exported_tokens: list[list[int]]
    first_difference: list[int | None]
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ValidationReport:
    """What :func:`validate` found: one :class:`LeafReport` per output leaf, the generation check, and every problem
    (a leaf missing or extra, a shape mismatch) that kept a leaf from being compared.

    ``str(report)`` is a summary line and one line per failing leaf, row and problem; ``to_dict()`` is JSON-able.
    """

    passed: bool
    export_format: str
    leaves: dict[str, LeafReport]
    generation: GenerationReport | None = None
    problems: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "export_format": self.export_format,
            "leaves": {name: leaf.to_dict() for name, leaf in self.leaves.items()},
            "generation": self.generation.to_dict() if self.generation is not None else None,
            "problems": list(self.problems),
        }

    def __str__(self) -> str:
        failing = [leaf for leaf in self.leaves.values() if not leaf.passed]
        parts = [f"{len(self.leaves) - len(failing)} of {len(self.leaves)} output leaves within tolerance"]
        judged = [leaf for leaf in self.leaves.values() if leaf.atol is not None and leaf.passed]
        if judged and not failing:
            worst = max(judged, key=lambda leaf: leaf.max_abs_diff)
            parts[0] += f" (largest diff {worst.max_abs_diff:.3g} on {worst.name})"
        gen = self.generation
        if gen is not None:
            rows, tokens = len(gen.eager_tokens), gen.max_new_tokens
            same = sum(d is None for d in gen.first_difference)
            parts.append(f"generation: {same} of {rows} rows give eager's {tokens} greedy tokens")
        lines = [f"validation {'passed' if self.passed else 'FAILED'} ({self.export_format}): " + "; ".join(parts)]
        lines += [f"  {leaf.describe()}" for leaf in failing]
        if gen is not None:
            for row, first in enumerate(gen.first_difference):
                if first is not None:
                    eager, got = gen.eager_tokens[row], gen.exported_tokens[row]
                    said = (f"eager {eager[first]}" if first < len(eager) else "eager ended") + ", export " + (
                        str(got[first]) if first < len(got) else "ended")
                    lines.append(f"  generation row {row}: first differing token at new position {first} ({said})")
            lines += [f"  note: {note}" for note in gen.notes]
        lines += [f"  problem: {problem}" for problem in self.problems]
        return "\n".join(lines)


def _json_float(value: Any) -> Any:
    """NaN and infinities as strings: JSON has no literal for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


# --- comparing leaves --------------------------------------------------------------------------------------------


def _leaf_numbers(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float, torch.Tensor, torch.Tensor]:
    """``(max abs diff, max rel diff, |diff|, |eager|)`` over the elements that are finite in both; the diff is NaN
    when NaNs or infinities sit in different places."""
    got = got.detach().cpu()
    want = want.detach().cpu()
    if not (got.is_floating_point() or want.is_floating_point()):
        diff = (got.to(torch.float64) - want.to(torch.float64)).abs()
        return (float(diff.max()) if diff.numel() else 0.0), (float(diff.max()) if diff.numel() else 0.0), diff, \
            want.to(torch.float64).abs()
    a, b = got.to(torch.float64), want.to(torch.float64)
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))  # equal infinities and NaN in the same place agree
    zero = torch.zeros_like(a)
    diff = torch.where(same, zero, (a - b).abs())
    ref = torch.where(same, zero, b.abs())  # an element that agrees is out of the relative diff
    if not diff.numel():
        return 0.0, 0.0, diff, ref
    if torch.isnan(diff).any():
        return math.nan, math.nan, diff, ref
    rel = diff / ref.clamp_min(1e-6)
    return float(diff.max()), float(rel.max()), diff, ref


def _compare_leaves(got: Any, want: Any, backend: str, atol: float | None, rtol: float | None, quantized: bool,
                    prefix: str = "") -> tuple[dict[str, LeafReport], list[str]]:
    """A :class:`LeafReport` per leaf of eager's outputs ``want`` found in the export's ``got``, and the problems."""
    got_leaves, want_leaves = get_leaf_tensors(got), get_leaf_tensors(want)
    leaves: dict[str, LeafReport] = {}
    problems: list[str] = []
    for name, ref in want_leaves.items():
        label = prefix + name
        if name not in got_leaves:
            problems.append(f"{label}: in eager's outputs, missing from the export's")
            continue
        out = got_leaves[name]
        if tuple(out.shape) != tuple(ref.shape):
            problems.append(f"{label}: shape {tuple(out.shape)} != eager {tuple(ref.shape)}")
            continue
        abs_diff, rel_diff, diff, magnitude = _leaf_numbers(out, ref)
        # the looser of the two dtypes: an fp16 export of an fp32 model is held to fp16's bar
        dtypes = sorted({out.dtype, ref.dtype}, key=lambda d: torch.finfo(d).eps if d.is_floating_point else 0)
        table = tolerance(dtypes[-1], backend, quantized)
        floating = dtypes[-1].is_floating_point
        if floating and (atol is not None or rtol is not None):
            table = (atol if atol is not None else (table or (0.0, 0.0))[0],
                     rtol if rtol is not None else (table or (0.0, 0.0))[1])
        if table is None:
            passed = not math.isnan(abs_diff)
        else:
            passed = not math.isnan(abs_diff) and bool((diff <= table[0] + table[1] * magnitude).all())
        leaves[label] = LeafReport(
            name=label, dtype=str(ref.dtype).removeprefix("torch."), shape=list(ref.shape), max_abs_diff=abs_diff,
            max_rel_diff=rel_diff, atol=None if table is None else table[0], rtol=None if table is None else table[1],
            passed=passed,
        )
    problems += [f"{prefix}{name}: in the export's outputs, not in eager's" for name in got_leaves
                 if name not in want_leaves]
    return leaves, problems


def compare_outputs(exported: Any, eager: Any) -> dict[str, Any]:
    """Max abs / rel diff per leaf tensor present in both outputs, and the overall max abs diff (no verdict: see
    :func:`validate` for one).

    Example:
        >>> compare_outputs({"a": torch.ones(2)}, {"a": torch.ones(2)})["max_abs_diff"]
        0.0
    """
    leaves, problems = _compare_leaves(exported, eager, "dynamo", None, None, quantized=False)
    problems = [p for p in problems if "not in eager's" not in p]
    numbers = {n: {"max_abs_diff": r.max_abs_diff, "max_rel_diff": r.max_rel_diff, "shape": r.shape}
               for n, r in leaves.items()}
    return {
        "max_abs_diff": max((v["max_abs_diff"] for v in numbers.values()), default=0.0),
        "leaves": numbers,
        "problems": problems,
    }


# --- validate ----------------------------------------------------------------------------------------------------


def validate(exported: Any, model: torch.nn.Module, inputs: Mapping[str, Any], *, generate: bool | dict | None = None,
             atol: float | None = None, rtol: float | None = None) -> ValidationReport:
    """Compare an export with its eager source model: every output leaf, and greedy generation token for token.

    A single-graph export (component ``"model"``) runs ``exported(**inputs)`` and ``model(**inputs)`` (no grad, on
    copies of ``inputs``) and compares every output leaf, each held to :func:`tolerance`'s bar for its dtype and the
    export's backend. An ``export_for_generation`` export generates greedily, with ``exported.generate`` and
    ``model.generate``, on a left-padded batch of 2 built from ``inputs``' first row (it, and a shorter prompt: its
    second half, padded with the model's pad id, or 0, and attention-mask zeros), for enough new tokens to decode
    past the text config's ``sliding_window`` where it has one (at most :data:`MAX_NEW_TOKENS`, and what the
    export's static cache holds); a decoder-only export also has its prefill and decode logits compared on eager's
    tokens (teacher-forced: leaves ``prefill.logits``, the last prompt position, and ``decode.logits``, every step).

    Args:
        exported: An :class:`~hfexport.ExportedModel`.
        model: The eager model it was exported from (or one with the weights it should match).
        inputs: Forward kwargs, as passed to the export (a tokenizer's output).
        generate: ``None`` or ``True``: the generation check for a generation export; a dict: generation kwargs for
            it (``max_new_tokens``); ``False``: only the teacher-forced logits.
        atol: Absolute tolerance for every float leaf instead of the table's.
        rtol: Relative tolerance for every float leaf instead of the table's.

    Returns:
        A :class:`ValidationReport`; ``passed`` is False when any leaf exceeds its tolerance, any token differs, or
        a leaf could not be compared.

    Example:
        >>> exported = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
        >>> report = hfexport.validate(exported, model, inputs)
        >>> report.passed, report.leaves["logits"].max_abs_diff <= 1e-4
        (True, True)
        >>> print(report)  # a summary line, then one line per failing leaf or row
        validation passed (dynamo): 5 of 5 output leaves within tolerance (largest diff 0 on logits)
    """
    backend = str(exported.export_format)
    components = dict(exported.components)
    quantized = any(c.metadata.export_config.get("quantizer") for c in components.values())
    if "model" in components:
        if generate:
            raise UnsupportedError("the generation check needs an export_for_generation export; this one has the "
                                   "single component 'model' (validate it without generate=)")
        with torch.no_grad():
            got = exported(**copy.deepcopy(dict(inputs)))
            want = model(**copy.deepcopy(dict(inputs)))
        leaves, problems = _compare_leaves(got, want, backend, atol, rtol, quantized)
        return _report(backend, leaves, None, problems)
    leaves, gen, problems = _validate_generation(exported, model, inputs, generate, atol, rtol, quantized)
    return _report(backend, leaves, gen, problems)


def _report(backend: str, leaves: dict[str, LeafReport], gen: GenerationReport | None,
            problems: list[str]) -> ValidationReport:
    if not leaves and gen is None and not problems:
        problems = ["nothing was compared: eager's outputs hold no tensor"]
    passed = all(leaf.passed for leaf in leaves.values()) and not problems and (gen is None or gen.passed)
    return ValidationReport(passed=passed, export_format=backend, leaves=leaves, generation=gen, problems=problems)


# --- generation --------------------------------------------------------------------------------------------------


def _pad_id(model: torch.nn.Module) -> int:
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        pad = getattr(source, "pad_token_id", None)
        if isinstance(pad, list | tuple):
            pad = pad[0] if pad else None
        if pad is not None:
            return int(pad)
    return 0


def _first_ids(exported: Any) -> Any:
    """The ``input_ids`` spec of the export's first graph (the prefill, else its only component), or None."""
    first = exported.components.get("prefill") or next(iter(exported.components.values()))
    return first.metadata.input_spec("input_ids")


def _static_prompt(exported: Any) -> bool:
    """Whether the first graph of the export was traced with a fixed prompt shape (static shapes): it then runs only
    on prompts of the sample's shape."""
    spec = _first_ids(exported)
    return spec is not None and all(isinstance(d, int) for d in spec.shape)


def _fixed_batch(exported: Any) -> int | None:
    """The batch size the first graph was traced with when it is fixed (None when it is dynamic)."""
    spec = _first_ids(exported)
    return spec.shape[0] if spec is not None and spec.shape and isinstance(spec.shape[0], int) else None


def _prompts(exported: Any, model: torch.nn.Module, inputs: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The left-padded batch of 2 the generation check runs on (or the inputs as given, with why)."""
    given = {k: v for k, v in inputs.items() if v is not None and not k.startswith("decoder_")}
    if set(given) - {"input_ids", "attention_mask"}:
        return given, [f"inputs other than text ({', '.join(sorted(set(given) - {'input_ids', 'attention_mask'}))}):"
                       " generation on the inputs as given"]
    if _static_prompt(exported):
        return given, ["the export has static shapes: generation on the inputs as given, not a padded batch of 2"]
    ids = given["input_ids"]
    mask = given.get("attention_mask")
    first = ids[0][mask[0].bool()] if mask is not None else ids[0]
    if _fixed_batch(exported) == 1:
        return {"input_ids": first[None], "attention_mask": torch.ones_like(first)[None]}, [
            "the export's batch is fixed at 1 (a cache kept as state): generation on one prompt, not a padded "
            "batch of 2"]
    if first.numel() < 2:
        first = first.repeat(2)
    second = first[first.numel() // 2 :]
    width = first.numel()
    pad = torch.full((width - second.numel(),), _pad_id(model), dtype=ids.dtype, device=ids.device)
    batch = torch.stack([first, torch.cat([pad, second])])
    attention = torch.ones_like(batch)
    attention[1, : pad.numel()] = 0
    return {"input_ids": batch, "attention_mask": attention}, []


def _new_tokens(exported: Any, model: torch.nn.Module, prompt_len: int, asked: int | None) -> tuple[int, list[str]]:
    """New tokens to decode: past the sliding window where the text config has one, within the static cache."""
    if asked is not None:
        return asked, []
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    window = getattr(config, "sliding_window", None)
    wanted = DEFAULT_NEW_TOKENS
    if isinstance(window, int) and window > 0:
        wanted = max(wanted, window + PAST_WINDOW - prompt_len)
    capacity = None
    if "decode" in exported.components:
        from .generation.loop import Component

        capacity = Component(exported, "decode").cache_capacity()
    notes = []
    limit = MAX_NEW_TOKENS if capacity is None else min(MAX_NEW_TOKENS, capacity - prompt_len)
    if wanted > limit:
        why = f"the export's static cache holds {capacity} positions" if limit < MAX_NEW_TOKENS else \
            f"the check decodes at most {MAX_NEW_TOKENS} tokens"
        wanted = max(limit, 1)
        if isinstance(window, int) and prompt_len + wanted <= window:
            notes.append(f"{why}: {wanted} new tokens after a {prompt_len}-token prompt do not decode past the "
                         f"sliding window ({window})")
    return wanted, notes


def _first_difference(eager: list[int], got: list[int]) -> int | None:
    for index, (a, b) in enumerate(zip(eager, got)):
        if a != b:
            return index
    return None if len(eager) == len(got) else min(len(eager), len(got))


def _validate_generation(exported: Any, model: torch.nn.Module, inputs: Mapping[str, Any], generate: Any,
                         atol: float | None, rtol: float | None,
                         quantized: bool) -> tuple[dict[str, LeafReport], GenerationReport | None, list[str]]:
    prompt, notes = _prompts(exported, model, inputs)
    asked = dict(generate) if isinstance(generate, Mapping) else {}
    # the decoder's prompt: an encoder-decoder's decoder starts from one token (its encoder input may be audio)
    encoder_decoder = "encoder" in exported.components
    prompt_len = 1 if encoder_decoder else prompt["input_ids"].shape[-1]
    new, more = _new_tokens(exported, model, prompt_len, asked.pop("max_new_tokens", None))
    notes += more
    # min_new_tokens: an early EOS would end the check before the window
    kwargs = {"do_sample": False, "num_beams": 1, "pad_token_id": _pad_id(model), "max_new_tokens": new,
              "min_new_tokens": new, **asked}
    with torch.no_grad():
        eager = model.generate(**copy.deepcopy(prompt), **kwargs, output_logits=True, return_dict_in_generate=True)
    # what precedes the new tokens: a decoder's prompt, an encoder-decoder's decoder start token
    start = eager.sequences.shape[-1] - len(eager.logits)
    eager_new = eager.sequences[:, start:]
    leaves: dict[str, LeafReport] = {}
    problems: list[str] = []
    components = exported.components
    decoder_only = "prefill" in components and "decode" in components and not {"encoder", "language_model"} & set(
        components)
    if decoder_only and prompt["input_ids"].shape[0] == eager_new.shape[0]:
        got, want = _forced_logits(exported, prompt, eager_new, eager.logits)
        leaves, problems = _compare_leaves(got, want, str(exported.export_format), atol, rtol, quantized)
    if generate is False:
        if not leaves and not problems:
            problems.append("generate=False on an export whose logits cannot be scored step by step: nothing was "
                            "compared")
        return leaves, None, problems
    with torch.no_grad():
        got_ids = exported.generate(**copy.deepcopy(prompt), **kwargs)
    if encoder_decoder or "attention_mask" not in prompt:
        lengths = [prompt_len] * len(eager_new)
    else:
        lengths = prompt["attention_mask"].sum(-1).tolist()
    eager_rows = eager_new.tolist()
    # model.generate of some encoder-decoders (Whisper) drops its decoder prompt from a tensor it returns but
    # keeps it in return_dict_in_generate's sequences: the export's new tokens are its last ones (every row runs to
    # min_new_tokens, rows that end early are padded to the longest)
    got_start = max(got_ids.shape[-1] - eager_new.shape[-1], 0) if encoder_decoder else start
    got_rows = [row[got_start:].tolist() for row in got_ids]
    if len(got_rows) != len(eager_rows):
        problems.append(f"generation: the export returned {len(got_rows)} rows, eager {len(eager_rows)}")
    first = [_first_difference(e, g) for e, g in zip(eager_rows, got_rows)]
    report = GenerationReport(
        passed=all(f is None for f in first) and len(got_rows) == len(eager_rows), max_new_tokens=new,
        prompt_lengths=[int(n) for n in lengths], eager_tokens=eager_rows, exported_tokens=got_rows,
        first_difference=first, notes=notes,
    )
    return leaves, report, problems


def _forced_logits(exported: Any, prompt: dict[str, Any], tokens: torch.Tensor,
                   eager_logits: tuple[torch.Tensor, ...]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The export's prefill logits (last prompt position) and decode logits, each decode step fed eager's token, as
    ``{leaf: tensor}`` for the export and for eager."""
    from .generation.decoder import decoder_session

    with torch.no_grad():
        _, logits, step = decoder_session(exported, copy.deepcopy(prompt), len(eager_logits))
        got = {"prefill.logits": logits[:, -1].cpu()}
        steps = [step(tokens[:, index])[:, -1].cpu() for index in range(len(eager_logits) - 1)]
    want = {"prefill.logits": eager_logits[0].cpu()}
    if steps:
        got["decode.logits"] = torch.stack(steps)
        want["decode.logits"] = torch.stack([t.cpu() for t in eager_logits[1:]])
    return got, want
