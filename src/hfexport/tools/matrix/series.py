"""Sample inputs of time-series models (main input ``past_values``), shaped from the config and named as the model's
forward signature names them.

- ``past_values``: ``context_length`` steps plus the largest lag of ``lags_sequence`` (Time Series Transformer,
  Informer, Autoformer look that far back), as ``[B, steps]`` where the series has one channel
  (``input_size`` / ``num_input_channels``), else ``[B, steps, channels]``; the other layout is tried when the model
  does not run on the first;
- ``past_observed_mask`` / ``observed_mask``: ones like ``past_values``; ``past_values_padding``: zeros ``[B, steps]``;
  ``past_time_features``: ``[B, steps, num_time_features]``; ``freq``: frequency class 0 per row;
- an encoder-decoder forecaster also gets ``future_values`` over ``prediction_length`` steps (and their
  ``future_time_features``): its decoder reads them, without them it has no positions to decode;
- static features where the config counts some: categorical ids below each ``cardinality``, reals.

Example:
    >>> from hfexport.tools.matrix.shrink import build_model
    >>> model = build_model("patchtst", "PatchTSTModel")
    >>> {k: tuple(v.shape) for k, v in series_inputs(model, torch.Generator(), 2, ["past_values"]).items()}
    {'past_values': (2, 32, 1)}
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from .media import first_that_runs

__all__ = ["series_inputs"]


def _int(config: Any, *names: str, default: int = 0) -> int:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _candidates(config: Any, gen: torch.Generator, batch: int, params: Any) -> Iterator[dict[str, Any]]:
    context = _int(config, "context_length", "context_len")
    if context <= 0:
        return
    lags = getattr(config, "lags_sequence", None)
    steps = context + (max(lags) if lags else 0)
    horizon = _int(config, "prediction_length", "horizon_length")
    channels = max(1, _int(config, "input_size", "num_input_channels", default=1))
    time_features = _int(config, "num_time_features")
    decodes = bool(getattr(config, "is_encoder_decoder", False)) and horizon > 0 and "future_values" in params
    values = torch.randn(batch, steps, channels, generator=gen)
    future = torch.randn(batch, horizon, channels, generator=gen) if decodes else None
    static = {}
    if "static_categorical_features" in params and _int(config, "num_static_categorical_features") > 0:
        cards = list(getattr(config, "cardinality", None) or [1])
        static["static_categorical_features"] = torch.stack(
            [torch.randint(0, max(1, c), (batch,), generator=gen) for c in cards], dim=1)
    if "static_real_features" in params and (n := _int(config, "num_static_real_features")) > 0:
        static["static_real_features"] = torch.randn(batch, n, generator=gen)
    for flat in (True, False) if channels == 1 else (False,):
        shaped = (lambda t: t[..., 0]) if flat else (lambda t: t)  # noqa: E731
        out: dict[str, Any] = {"past_values": shaped(values), **static}
        for name in ("past_observed_mask", "observed_mask"):
            if name in params:
                out[name] = torch.ones_like(out["past_values"])
        if "past_values_padding" in params:
            out["past_values_padding"] = torch.zeros(batch, steps, dtype=torch.long)
        if "past_time_features" in params:
            out["past_time_features"] = torch.randn(batch, steps, time_features, generator=gen)
        if future is not None:
            out["future_values"] = shaped(future)
            if "future_time_features" in params:
                out["future_time_features"] = torch.randn(batch, horizon, time_features, generator=gen)
        if "freq" in params:
            for freq in (torch.zeros(batch, 1, dtype=torch.long), torch.zeros(batch, dtype=torch.long)):
                yield {**out, "freq": freq}
        else:
            yield out


def series_inputs(model: Any, gen: torch.Generator, batch: int, params: Any) -> dict[str, Any]:
    """The first of the time-series candidates ``model`` runs on (``{}`` when the config names no context
    length)."""
    return first_that_runs(model, _candidates(model.config, gen, batch, params))
