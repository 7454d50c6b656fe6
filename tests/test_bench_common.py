"""The arithmetic of benchmarks/common.py (the roofline and the table cells), not its timings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "common.py"
_spec = importlib.util.spec_from_file_location("bench_common", _PATH)
common = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(common)


def test_decode_bound_is_bandwidth_over_the_weight_bytes():
    # SmolLM2-135M in fp32 (538 MB of weights) at 20 GB/s: each token reads every weight once
    assert common.decode_bound(538_000_000, 20.0) == pytest.approx(20e9 / 538e6)
    assert common.decode_bound(1_000_000_000, 50.0) == pytest.approx(50.0)
    # half the bytes (int8 vs bf16), twice the ceiling
    assert common.decode_bound(500_000_000, 50.0) == pytest.approx(2 * common.decode_bound(1_000_000_000, 50.0))


def test_a_copy_counts_the_bytes_read_and_the_bytes_written():
    assert common.copy_gbps(1 << 30, 0.5) == pytest.approx(2 * (1 << 30) / 0.5 / 1e9)
    assert common.copy_gbps(10**9, 1.0) == pytest.approx(2.0)


def test_memory_bandwidth_keeps_the_fastest_copy(monkeypatch):
    """With a clock that makes the copies take 0.4, 0.1, 0.3 s: the result is the 0.1 s copy's bandwidth."""
    ticks = iter([0.0, 0.4, 1.0, 1.1, 2.0, 2.3])
    monkeypatch.setattr(common.time, "perf_counter", lambda: next(ticks))
    assert common.memory_bandwidth(nbytes=1 << 20, repeats=3) == pytest.approx(2 * (1 << 20) / 0.1 / 1e9)


def test_summarise_keeps_the_best_round_and_compares_every_round_with_eager():
    results = {
        "eager": {"rounds": [{"decode_tok_s": 20.0, "prefill_s": 0.2}, {"decode_tok_s": 25.0, "prefill_s": 0.1}],
                  "round_tokens": [[1, 2, 3], [1, 2, 3]]},
        "late": {"rounds": [{"decode_tok_s": 30.0, "prefill_s": 0.3}], "round_tokens": [[1, 2, 3, 9]]},
        "off": {"rounds": [{"decode_tok_s": 40.0, "prefill_s": 0.3}], "round_tokens": [[1, 5, 3]]},
    }
    assert common.summarise(results) == [1, 2, 3]
    assert (results["eager"]["decode_tok_s"], results["eager"]["prefill_s"]) == (25.0, 0.1)
    # a loop with no end-of-sequence stop runs on after eager's last token: the extra tokens are not compared
    assert results["late"]["same_tokens"] and results["late"]["first_difference"] is None
    assert not results["off"]["same_tokens"] and results["off"]["first_difference"] == 1
    assert "round_tokens" not in results["off"]
    row = common.result_cells(results["off"], 25.0, where=True)
    assert row == "300 | 40.0 | 1.60x | **NO** (first difference at token 1)"


def test_export_cells_against_the_weights_and_dashes_without_an_export():
    record = {"export_s": 18.26, "peak_rss": 1_591_000_000, "bytes": 539_000_000, "ir_bytes": 1_078_000_000,
              "weight_bytes": 539_000_000}
    assert common.export_cells(record, load={"load_s": 0.84}) == "18.3 | 1591 | 539 (1.00x) | 0.8"
    assert common.export_cells(record, "ir_bytes") == "18.3 | 1591 | 1078 (2.00x)"
    assert common.export_cells(None, load={}) == "– | – | – | –"
    assert common.export_cells({"error": "failed"}) == "– | – | –"


def test_run_main_writes_the_section_and_the_report_unless_quick(tmp_path, capsys):
    import argparse

    def run(results):
        results["onnx"] = {"smollm2": {"results": {}}, "wall_s": 1.5}
        return "## section\n"

    args = argparse.Namespace(export_child=None, quick=False, results=tmp_path / "RESULTS_X.md")
    assert common.run_main(args, "bench-x", "onnx", None, run) == {"smollm2": {"results": {}}, "wall_s": 1.5}
    assert (tmp_path / "RESULTS_X.md").read_text() == "## section\n"
    assert common.json.loads((tmp_path / "RESULTS_X.json").read_text())["wall_s"] == 1.5

    quick = argparse.Namespace(export_child=None, quick=True, results=tmp_path / "QUICK.md")
    common.run_main(quick, "bench-x", "onnx", None, run)
    assert not (tmp_path / "QUICK.md").exists()

    child = argparse.Namespace(export_child="static", out=tmp_path / "out", quick=False, results=None)
    capsys.readouterr()
    assert common.run_main(child, "bench-x", "onnx", lambda v, out: {"variant": v, "out": str(out)}, run) is None
    assert common.json.loads(capsys.readouterr().out.splitlines()[-1]) == {"variant": "static",
                                                                           "out": str(tmp_path / "out")}
