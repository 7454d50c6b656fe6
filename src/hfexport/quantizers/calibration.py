"""Calibration samples in the form each quantized model takes, and per-component capture for generation.

- :func:`traced_kwargs`: a sample as the traced forward kwargs (for FX-graph quantizers).
- :func:`flat_feeds`: a sample as the named, flat tensors of a converted graph (ONNX feeds, OpenVINO port feeds),
  matched by position: a converted graph's inputs are the traced kwargs' tensor leaves in pytree order, as the
  runners feed them.
- :func:`capture_calibration`: ``generate`` kwargs -> one list of forward kwargs per exported component.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..pytrees import register_cache_classes, tensor_leaves
from .base import traced_kwargs

__all__ = ["traced_kwargs", "flat_feeds", "capture_calibration", "check_quantizers", "calibrate_components",
           "same_recipe"]


def flat_feeds(sample: Mapping[str, Any], keys: Sequence[str], names: Sequence[str], dtypes: Sequence[Any]) -> dict:
    """The tensor leaves of ``sample`` (its traced ``keys``, in order) as ``{input name: numpy array}``.

    Args:
        sample: Forward kwargs (caches included).
        keys: The traced kwargs, in traced order.
        names: The converted graph's input names, in order.
        dtypes: The numpy dtype of each input (a leaf of another dtype is cast, as the runners do).
    """
    register_cache_classes()
    leaves = tensor_leaves(traced_kwargs(sample, keys))
    if len(leaves) != len(names):
        raise ValueError(
            f"a calibration sample flattens to {len(leaves)} tensors but the converted graph takes {len(names)} "
            f"({list(names)[:6]}...): give samples with the same inputs (and cache layout) as the export's"
        )
    return {
        name: leaf.detach().cpu().numpy().astype(dtype, copy=False) for name, leaf, dtype in zip(names, leaves, dtypes)
    }


def capture_calibration(
    model: torch.nn.Module,
    calibration_dataset: Iterable[Mapping[str, Any]],
    generation_config: Any = None,
    multi_token_decode: bool = False,
    logits_to_keep_input: bool = False,
) -> dict[str, list[dict[str, Any]]]:
    """Run each ``generate``-kwargs sample through :func:`~hfexport.utils.decompose_for_generation` and collect
    every component's forward kwargs: ``{component: [kwargs, ...]}``.

    A multi-token decode graph over a static cache also serves the prompt, so it calibrates on the prefill inputs
    too.

    Example:
        >>> calib = capture_calibration(model, [tok("Hello", return_tensors="pt")])
        >>> sorted(calib), len(calib["decode"])
        (['decode', 'prefill'], 1)
    """
    from ..capture.split import decompose_for_generation, last_logits_only

    per_component: dict[str, list[dict[str, Any]]] = {}
    for sample in calibration_dataset:
        components = decompose_for_generation(
            model, dict(sample), generation_config=generation_config, multi_token_decode=multi_token_decode,
            logits_to_keep_input=logits_to_keep_input,
        )
        for name, (module, kwargs) in components.items():
            if name == "prefill":  # as the exporter traces a prefill graph of its own: logits_to_keep=1
                kwargs = last_logits_only(module, kwargs)
            per_component.setdefault(name, []).append(kwargs)
        if multi_token_decode and _static(generation_config) and "prefill" in components and "decode" in components:
            per_component["decode"].append(_as_decode_call(components["prefill"][1], components["decode"][1]))
    return per_component


def _as_decode_call(prefill: dict[str, Any], decode: Mapping[str, Any]) -> dict[str, Any]:
    """The prefill call's kwargs with the mask the decode graph takes: over a static cache, ``generate`` passes no
    mask to the first forward (the model builds the causal one) but a 4D ``[batch, 1, query, cache slots]`` mask to
    the decode steps, and the decode graph serving the prompt takes one too: the causal mask over the first slots, as
    the runner feeds it (hfexport.generation's slot masks); and a graph that takes the positions to project
    (``logits_to_keep``) the prompt's last one, as generate() passes it."""
    out = dict(prefill)
    cache = decode.get("past_key_values")
    if cache is not None and hasattr(cache, "layers"):
        # the prefill's static cache is not allocated yet (transformers allocates it lazily, in the first forward):
        # the decode's cache, emptied, has the layout the graph takes
        out["past_key_values"] = cache = copy.deepcopy(cache)
        for layer in cache.layers:
            for value in vars(layer).values():
                if isinstance(value, torch.Tensor):
                    value.zero_()
    mask, ids = decode.get("attention_mask"), out.get("input_ids")
    if isinstance(decode.get("logits_to_keep"), torch.Tensor) and isinstance(ids, torch.Tensor):
        out["logits_to_keep"] = torch.tensor([ids.shape[1] - 1])  # the runner projects a prompt's last position only
    if "attention_mask" in out or not isinstance(mask, torch.Tensor) or not isinstance(ids, torch.Tensor):
        return out
    if mask.dim() == 4:
        query, slots = torch.arange(ids.shape[1]), torch.arange(mask.shape[-1])
        causal = (slots[None, :] <= query[:, None]).expand(ids.shape[0], 1, -1, -1)
        if mask.dtype == torch.bool:
            out["attention_mask"] = causal.clone()
        else:
            blocked = torch.tensor(torch.finfo(mask.dtype).min, dtype=mask.dtype)
            out["attention_mask"] = torch.where(causal, torch.zeros((), dtype=mask.dtype), blocked)
    elif mask.dim() == 2:
        out["attention_mask"] = torch.ones(ids.shape[:2], dtype=mask.dtype)
    return out


def numpy_dtype(name: str) -> Any:
    """The numpy dtype of an ONNX / OpenVINO element type name (``"float32"``, ``"int64"``, ``"f32"``, ``"i64"``)."""
    short = {"f32": "float32", "f16": "float16", "f64": "float64", "i64": "int64", "i32": "int32", "i8": "int8",
             "u8": "uint8", "boolean": "bool", "u1": "bool"}
    return np.dtype(short.get(name, name))


def check_quantizers(config: Any, export_format: Any) -> None:
    """``validate_environment`` of every quantizer in ``config`` (one config, or a dict of per-component ones)."""
    configs = config.values() if isinstance(config, Mapping) and "export_format" not in config else [config]
    for component_config in configs:
        quantizer = component_config.get("quantizer") if isinstance(component_config, Mapping) else getattr(
            component_config, "quantizer", None
        )
        if quantizer is not None and hasattr(quantizer, "validate_environment"):
            quantizer.validate_environment(export_format)


def calibrate_components(
    model: torch.nn.Module,
    config: Any,
    configs: dict[str, Any],
    export_format: Any,
    generation_config: Any = None,
    multi_token_decode: bool = False,
    logits_to_keep_input: bool = False,
) -> dict[str, Any]:
    """Per-component configs for ``export_for_generation`` (whose quantizers :func:`check_quantizers` checked):
    where one config serves every component and its quantizer has ``generate``-kwargs calibration samples, one
    copy of it per component calibrating on that component's captured forward kwargs."""
    quantizer = getattr(config, "quantizer", None)
    per_component = isinstance(config, Mapping) and "export_format" not in config
    if quantizer is None or per_component or quantizer.calibration_dataset is None:
        return configs
    captured = capture_calibration(model, quantizer.calibration_dataset, generation_config, multi_token_decode,
                                   logits_to_keep_input)
    out = {
        name: dataclasses.replace(c, quantizer=quantizer.with_calibration(captured.get(name) or None))
        for name, c in configs.items()
    }
    if multi_token_decode and _static(generation_config) and "prefill" in out and "decode" in out:
        # one multi-token graph may serve both (HfExporter.serves_prefill compares the configs); its calibration set
        # holds the prefill samples too
        out["prefill"] = out["decode"]
    return out


def same_recipe(a: Any, b: Any) -> bool:
    """Whether two component configs are equal but for their quantizers' calibration samples (calibrate_components
    gives each component a copy of one quantizer, calibrating on that component's own calls): then one graph may
    serve both (a stateful OpenVINO decode over a growing cache runs the prompt too, calibrated on the decode steps)."""
    if a == b:
        return True
    qa, qb = getattr(a, "quantizer", None), getattr(b, "quantizer", None)
    if qa is None or qb is None or type(qa) is not type(qb) or not dataclasses.is_dataclass(a):
        return False

    def rest(q: Any) -> dict[str, Any]:  # the settings: not the samples, nor what it read from a program (_private)
        return {k: v for k, v in vars(q).items() if k != "calibration_dataset" and not k.startswith("_")}

    return dataclasses.replace(a, quantizer=None) == dataclasses.replace(b, quantizer=None) and rest(qa) == rest(qb)


def _static(generation_config: Any) -> bool:
    return getattr(generation_config, "cache_implementation", None) == "static"
