"""OpenVINO exports of tiny models of every family match eager PyTorch on OpenVINO Runtime (CPU, fp32).

Each case is exported once and checked on the export's own shapes, on another batch size and sequence length, and
after a save and reload (``openvino_model.xml`` / ``.bin``). fp32 tolerance: max abs diff <= 1e-3 over every output
leaf (logits, hidden states, caches). The runner compiles an fp32 export with an f32 precision hint: the CPU plugin's
default on this processor is bf16, which misses the tolerance (checked in tests/test_openvino_backend.py).
"""

from __future__ import annotations

import pytest

from hfexport import OpenVINOConfig
from hfexport.exporter_openvino import OpenVINOExporter
from parity_cases import CASES, case_params, check_other_shapes, check_reload, check_same_inputs, export_case

TOL = 1e-3


@pytest.fixture(scope="module", params=case_params(CASES))
def exported_case(request, tmp_path_factory):
    config = OpenVINOConfig(dynamic=True)
    return export_case(request.param, lambda model, inputs: OpenVINOExporter().export(model, inputs, config=config),
                       tmp_path_factory)


def test_same_other_shapes_and_reload_match_eager(exported_case):
    check_same_inputs(exported_case, TOL)
    check_other_shapes(exported_case, TOL)
    check_reload(exported_case, TOL)
    tmp = exported_case[4]
    assert (tmp / "openvino_model.xml").is_file() and (tmp / "openvino_model.bin").is_file()
