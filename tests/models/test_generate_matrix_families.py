"""Families the support matrix could not build, feed or generate with, run through the matrix's own worker: the
export's greedy tokens against eager ``model.generate`` (the worker compares them token for token and reports the
first difference). Each was a cannot-build, no-inputs or fail row before (issue 22)."""

from __future__ import annotations

import pytest

from hfexport.tools.matrix.discovery import discover
from hfexport.tools.matrix.worker import run_case

CASES = [
    ("vipllava", "generate"),  # its feature layers without the CLS token (glue), two layers of the tiny tower
    ("moonshine_streaming", "generate"),  # its default config leaves num_key_value_heads unset
    ("shieldgemma2", "export"),  # Gemma 3's image tokens (16 patches pooled 2 x 2)
    ("deepseek_vl", "generate"),  # its projector is an `aligner`: the glue took the tower's pooled output instead
    ("janus", "generate"),
    # its generate() hands forward pixel_values=None beside the encoders' outputs, and its decode graph takes the
    # grid as a constant None: capture put the inputs back only where absent, generation passed the grid each step
    ("hunyuan_vl", "generate"),
    ("internvl", "generate"),  # its tower's patch grid pixel-shuffled before the projector (glue.BEFORE_PROJECTOR)
    ("dbrx", "generate"),  # its experts loop over the experts hit (workaround dbrx-batched-experts)
    # its generate passes no position_ids: one row counted over the padded prompt, and a decode graph that computes
    # its own (the loop fed the mask's [batch, seq] positions to both)
    ("exaone4_5", "generate"),
]


@pytest.mark.parametrize("model_type,stage", CASES)
def test_the_family_exports_and_generates_like_eager(model_type, stage):
    (arch,) = discover([f"={model_type}"])
    result = run_case(arch.model_type, arch.class_name, arch.task, "dynamo", stage)
    assert result["status"] == "pass", result["reason"]
    if stage == "generate":
        assert result["mismatched_tokens"] == 0
    else:
        assert result["max_abs_diff"] <= 1e-4
