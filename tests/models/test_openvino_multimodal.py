"""OpenVINO: the vision towers of the image-text-to-text models convert and match eager PyTorch.

Two of the PyTorch frontend's gaps (openvino 2026.3) stopped them, each now a registered workaround:
``openvino-index-add`` (an exported ``aten.index_add`` lacks the ``alpha`` the translator requires: Qwen2-VL's
vision tower) and ``openvino-repeated-outputs`` (a program returning one node twice: CLIP's ``last_hidden_state``
is also ``hidden_states[-1]``, LLaVA). Each is checked on a minimal program (also that the plain frontend still
fails there: when it stops failing, drop the workaround) and on the tower it was found in. The whole generation
of these models on OpenVINO is in test_generate_openvino.py (sweep); ViT and Whisper forward parity is in
test_openvino_parity.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hfexport import ExportError, OpenVINOConfig
from hfexport.capture.multimodal import decompose_multimodal
from hfexport.exporter_openvino import OpenVINOExporter
from hfexport.testing.tiny import TINY_CASES
from hfexport.validation import compare_outputs
from hfexport.workarounds.registry import applied_workarounds

ov = pytest.importorskip("openvino", reason="the OpenVINO backend needs `pip install openvino`")
TOL = 1e-4


class _IndexAdd(torch.nn.Module):
    def forward(self, index, source, rows):
        counts = torch.zeros(5, dtype=source.dtype).index_add(0, index, source)
        return counts * 2, torch.ones(3, 5, 2).index_add(1, index, rows, alpha=3)


class _Repeated(torch.nn.Module):
    def forward(self, x):
        y = x + 1
        return y, (x * 2, y, x > 0, x > 0)


def _run(model, *args):
    compiled = ov.compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})  # the CPU default may be bf16
    return list(compiled([a.numpy() for a in args]).to_tuple())


def _index_add_program():
    index, source, rows = torch.tensor([0, 2, 2, 4]), torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.randn(3, 4, 2)
    n = torch.export.Dim("n")
    program = torch.export.export(_IndexAdd(), (index, source, rows),
                                  dynamic_shapes=({0: n}, {0: n}, {1: n}))
    return program, (index, source, rows)


def test_index_add_converts_with_its_workaround_and_matches_torch():
    program, args = _index_add_program()
    with pytest.raises(Exception, match="Got less inputs 4 than expected 5"):  # openvinotoolkit/openvino#35628
        ov.convert_model(program)
    with applied_workarounds("openvino", None, {}) as fired:
        converted = ov.convert_model(program)
    assert "openvino-index-add" in fired
    longer = (torch.tensor([1, 1, 3, 0, 4, 4]), torch.arange(6.0), torch.randn(3, 6, 2))  # another index length
    for call in (args, longer):
        expected = _IndexAdd()(*call)
        got = _run(converted, *call)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e.numpy(), rtol=0, atol=1e-5)


def test_an_output_returned_twice_converts_with_its_workaround():
    x = torch.randn(2, 3)
    program = torch.export.export(_Repeated(), (x,))
    with pytest.raises(Exception, match="Tensor name is not a number"):
        ov.convert_model(program)
    with applied_workarounds("openvino", None, {}) as fired:
        converted = ov.convert_model(program)
    assert "openvino-repeated-outputs" in fired
    expected = [t.numpy() for t in (x + 1, x * 2, x + 1, x > 0, x > 0)]
    got = _run(converted, x)
    assert [g.dtype for g in got] == [e.dtype for e in expected]
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g, e)


@pytest.fixture(scope="module", params=["llava", "qwen2_vl"])
def tower(request):
    """The image encoder of the tiny model as generation captures it, and its OpenVINO export."""
    case = TINY_CASES[request.param]
    model = case.build()
    encoder, kwargs = decompose_multimodal(model, case.inputs(2, 5))["image_encoder"]
    exported = OpenVINOExporter().export(encoder, dict(kwargs), OpenVINOConfig(dynamic=True))
    return request.param, encoder, kwargs, exported


def test_vision_tower_converts_and_matches_eager(tower):
    name, encoder, kwargs, exported = tower
    workaround = {"llava": "openvino-repeated-outputs", "qwen2_vl": "openvino-index-add"}[name]
    assert workaround in exported.components["model"].metadata.workarounds
    case = TINY_CASES[name]
    other = decompose_multimodal(case.build(), case.inputs(3, 4))["image_encoder"][1]  # three images
    for call in (kwargs, other):
        with torch.no_grad():
            eager = encoder(**call)
        report = compare_outputs(exported(**call), eager)
        assert not report["problems"] and report["leaves"], report
        assert report["max_abs_diff"] <= TOL, report["leaves"]


class _Histogram(torch.nn.Module):
    def forward(self, x):
        return torch.histc(x, bins=4) + 1


def test_an_op_the_frontend_cannot_convert_names_component_op_and_what_to_try():
    with pytest.raises(ExportError) as raised:
        OpenVINOExporter().export(_Histogram(), {"x": torch.randn(2, 3)}, OpenVINOConfig())
    message = str(raised.value)
    assert "component 'model' (_Histogram)" in message
    assert "PyTorch frontend cannot convert aten.histc.default" in message
    assert "Try: another backend" in message
