"""``support-matrix.jsonl``: each row on disk as its case finishes, ``--resume`` skips what is recorded, and the
reports are regenerated from every recorded row with the runs that produced them. The cases here are fake (the
scheduler is replaced by one that returns made-up rows), so only the recording is under test."""

from __future__ import annotations

import csv
import json

import pytest

import hfexport.tools.matrix.command as command
from hfexport.cli import main
from hfexport.tools.matrix.results import Recorder, load, recorded

FAMILIES = ["--families", "=llama", "=bert", "=gpt2"]  # 3 architectures, 2 generative: 5 Dynamo cases


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C in the middle of the run (the command reports other exceptions as one line and exits 1)."""


def fake_scheduler(seen: list, stop_after: int | None = None):
    """Stands in for run_matrix: a made-up row per case through ``on_result``; raises after ``stop_after`` rows."""

    def run_matrix(cases, jobs=1, timeout=300, on_result=None, launcher="forkserver", cluster=None):
        rows = []
        for i, case in enumerate(cases):
            if stop_after is not None and i == stop_after:
                raise Interrupted()
            seen.append((case.arch.model_type, case.stage))
            status = "fail" if case.arch.model_type == "gpt2" else "pass"
            row = case.row(status=status, reason="made up" if status == "fail" else "", export_seconds=1.5,
                           max_abs_diff=0.0 if case.stage == "export" else None)
            rows.append(row)
            on_result(row, i + 1, len(cases))
        return rows

    return run_matrix


def _run(out, *extra):
    return main(["matrix", "--backends", "dynamo", *FAMILIES, "--out", str(out), "--no-png", *extra])


def test_an_interrupted_run_keeps_its_finished_rows_and_resume_runs_only_the_rest(tmp_path, monkeypatch):
    first: list = []
    monkeypatch.setattr(command, "run_matrix", fake_scheduler(first, stop_after=2))
    with pytest.raises(Interrupted):
        _run(tmp_path)
    assert recorded(tmp_path / "support-matrix.jsonl") == {("bert", "dynamo", "export"),
                                                           ("gpt2", "dynamo", "export")}
    assert not (tmp_path / "support-matrix.md").exists()  # no report from an interrupted run

    second: list = []
    monkeypatch.setattr(command, "run_matrix", fake_scheduler(second))
    assert _run(tmp_path, "--resume") == 0
    assert second == [("gpt2", "generate"), ("llama", "export"), ("llama", "generate")]
    with (tmp_path / "support-matrix.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert sorted((r["model_type"], r["stage"], r["status"]) for r in rows) == [
        ("bert", "export", "pass"), ("gpt2", "export", "fail"), ("gpt2", "generate", "fail"),
        ("llama", "export", "pass"), ("llama", "generate", "pass")]
    md = (tmp_path / "support-matrix.md").read_text()
    assert md.count("- Run `") == 2  # both runs, each with what it produced
    assert "interrupted or stopped before its end" in md and "finished (3 cases recorded by it)" in md
    assert "--resume" in md and "3 of the" in md


def test_a_later_run_replaces_a_case_and_report_only_regenerates_from_the_record(tmp_path, monkeypatch):
    monkeypatch.setattr(command, "run_matrix", fake_scheduler([]))
    assert _run(tmp_path) == 0
    jsonl = tmp_path / "support-matrix.jsonl"
    rec = Recorder(jsonl, {"command": "a fix re-run"})
    rec.add({"model_type": "gpt2", "class_name": "GPT2LMHeadModel", "task": "text-generation", "backend": "dynamo",
             "stage": "export", "status": "pass", "max_abs_diff": 0.0, "export_seconds": 2.0, "reason": ""})
    rec.close()
    with jsonl.open("a") as f:
        f.write('{"model_type": "llama", "backend": "dyn')  # a line cut short by a kill is skipped
    (tmp_path / "support-matrix.md").unlink()
    assert main(["matrix", "--report-only", "--out", str(tmp_path), "--no-png"]) == 0
    rows, runs = load(jsonl)
    gpt2 = [r for r in rows if (r["model_type"], r["stage"]) == ("gpt2", "export")]
    assert len(rows) == 5 and [r["status"] for r in gpt2] == ["pass"] and len(runs) == 2
    md = (tmp_path / "support-matrix.md").read_text()
    assert "| dynamo | export | 3 | 3 | 0 | 100.0 % | 0 | 100.0 % |" in md and "a fix re-run" in md


def test_every_line_is_json_and_a_row_names_its_run(tmp_path):
    path = tmp_path / "m.jsonl"
    rec = Recorder(path, {"command": "c", "load_start": [1.0, 2.0, 3.0]})
    rec.add({"model_type": "bert", "backend": "onnx", "stage": "export", "status": "pass"})
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["run"]["id"] == rec.id == lines[1]["run"] and lines[1]["finished"].endswith("Z")
