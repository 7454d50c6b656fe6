"""Workaround torchvision-ops-without-extension: timm's models (and transformers.modeling_utils, which imports
torchvision where it is installed) where torchvision's C++ extension does not load."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from hfexport.workarounds.torchvision_ops import extension_loads


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def without_extension() -> None:
    if extension_loads() is not False:
        pytest.skip("torchvision is missing or its C++ extension loads here: pytorch/vision#9337 (the unguarded "
                    "register_fake('torchvision::nms')) does not arise")


def test_without_the_workaround_torchvision_does_not_import(without_extension: None) -> None:
    # the premise: the hook (which `import hfexport`, and the venv's .pth, install) taken out first
    out = _python("import hfexport.workarounds.torchvision_ops as m; m._remove_hook(); import torchvision")
    assert out.returncode != 0
    assert "operator torchvision::nms does not exist" in out.stderr


def test_with_it_transformers_imports_torchvision_and_nms_still_refuses_to_run(without_extension: None) -> None:
    out = _python(
        "import hfexport, transformers.modeling_utils, sys, torch, torchvision, timm\n"
        "assert 'torchvision' in sys.modules\n"
        "try:\n"
        "    torchvision.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)\n"
        "except Exception as e:\n"
        "    print('refused', type(e).__name__)\n")
    assert out.returncode == 0, out.stderr[-2000:]
    # no kernel behind the schema: the op fails loudly, it computes nothing
    assert "refused" in out.stdout


def test_a_timm_backed_model_builds_and_exports_equal_to_eager(without_extension: None) -> None:
    from hfexport import DynamoConfig, DynamoExporter
    from hfexport.tools.matrix.shrink import build_model

    model = build_model("detr", "DetrModel")  # a TimmBackbone (resnet) under DETR's encoder-decoder
    assert any(type(m).__module__ == "timm.models.resnet" for m in model.modules())
    torch.manual_seed(0)
    inputs = {"pixel_values": torch.randn(2, 3, 64, 64)}
    with torch.no_grad():
        eager = model(**inputs).last_hidden_state
    exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=False))
    got = exported(**inputs).last_hidden_state
    assert got.shape == eager.shape
    assert (got - eager).abs().max().item() <= 1e-4
