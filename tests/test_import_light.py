"""``import hfexport`` (and the spec's import paths) load no backend package: each is imported on first use."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
HEAVY = ["onnx", "onnxscript", "onnx_ir", "onnxruntime", "executorch", "openvino", "nncf"]


def _loaded_after(code: str) -> dict:
    probe = (
        f"{code}\n"
        "import json, sys\n"
        f"heavy = {HEAVY!r}\n"
        "print('RESULT' + json.dumps({\n"
        "    'heavy': sorted(m for m in sys.modules if m.split('.')[0] in heavy),\n"
        "    'backends': sorted(m for m in sys.modules if m.startswith('hfexport.backends.')),\n"
        "}))\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT"))
    return json.loads(line.removeprefix("RESULT"))


def test_import_loads_no_backend_package():
    loaded = _loaded_after("import hfexport\nimport hfexport.utils\nimport hfexport.exporter_dynamo")
    assert loaded["heavy"] == []
    # the Dynamo backend is what exporter_dynamo is for; no other backend comes with it
    assert all(m.startswith("hfexport.backends.dynamo") for m in loaded["backends"]), loaded["backends"]


def test_bare_import_loads_no_backend_module_at_all():
    loaded = _loaded_after("import hfexport\nassert 'DynamoExporter' in hfexport.__all__")
    assert loaded["heavy"] == []
    assert loaded["backends"] == []


def test_configs_and_registry_lookups_stay_light():
    code = (
        "import hfexport\n"
        "from hfexport import AutoExportConfig\n"
        "for fmt in ('onnx', 'executorch', 'openvino'):\n"
        "    AutoExportConfig.from_dict({'export_format': fmt}).to_json_string()\n"
        "hfexport.DynamoExporter\n"
    )
    loaded = _loaded_after(code)
    assert loaded["heavy"] == []
