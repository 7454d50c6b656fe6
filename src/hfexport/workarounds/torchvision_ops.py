"""Model build: ``import torchvision`` fails where its C++ extension cannot load, and with it timm and every
transformers model built on timm (DETR's, Table Transformer's and OmDet-Turbo's TimmBackbone, TimmWrapper in
Gemma 3n, FastVLM and Perception LM, the Perception Encoder video towers).

torchvision registers fake kernels for ``torchvision::nms`` and ``torchvision::qnms`` without checking that its
extension defined them (torchvision/_meta_registrations.py:163 and :177, 0.17 to 0.28 at least; its other fake
kernels are guarded by ``extension._has_ops()``), so where ``_C.so`` cannot load (PyPI's torchvision wheel is
linked to CUDA's libtorch: beside the CPU build of torch it misses ``libtorch_cuda.so``) the import raises
``RuntimeError: operator torchvision::nms does not exist`` — pytorch/vision#9337, fixed by the open pull request
pytorch/vision#9649. None of those models calls a torchvision op in its forward: only timm's layers import
torchvision (``torchvision.ops.misc.FrozenBatchNorm2d``).

The fix defines the two ops' schemas, with no kernel, before torchvision is imported: the import then succeeds,
and a call of ``nms`` still fails (torch: no kernel for the op; torchvision: ``_assert_has_ops()``). ``import
hfexport`` installs an import hook (:func:`install_import_hook`) that applies it, through the registry's apply
loop, when torchvision is first imported (by timm, or by transformers' fast image processors), and only where
torchvision's extension does not load; ``import hfexport`` itself imports neither torch nor torchvision. Not undone:
once torchvision is imported its fake kernels stay registered on these schemas. Drop it once the tested torchvision
guards the two registrations.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from typing import Any

from .registry import ON_IMPORT, Undo, applied_workarounds, workaround

__all__ = ["ID", "extension_loads", "install_import_hook"]

ID = "torchvision-ops-without-extension"

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_library: Any = None  # the fragment that holds the schemas (a torch.library.Library frees its ops when collected)


def _op_defined(name: str) -> bool:
    import torch

    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
    except RuntimeError:
        return False
    return True


def extension_loads() -> bool | None:
    """Whether torchvision's C++ extension loads (``None``: torchvision is not installed). Loading it is what
    ``import torchvision`` does first (``torch.ops.load_library``), so a success changes nothing."""
    import torch

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = os.path.join(folder, "_C" + suffix)
            if os.path.isfile(path):
                try:
                    torch.ops.load_library(path)
                except (OSError, RuntimeError):
                    return False
                return True
    return False


def _needed(model: Any, inputs: dict) -> bool:
    return extension_loads() is False and not _op_defined("nms")


@workaround(
    id=ID,
    backend=ON_IMPORT,
    target="torchvision/_meta_registrations.py: register_fake('torchvision::nms'), register_fake('torchvision::qnms')",
    breaks="`import torchvision` raises 'operator torchvision::nms does not exist' where its C++ extension cannot "
           "load (PyPI's CUDA-linked wheel beside CPU torch), so timm and the transformers models built on timm "
           "(TimmBackbone, TimmWrapper) cannot be built",
    upstream="https://github.com/pytorch/vision/issues/9337",
    versions={"torchvision": ">=0.17"},
    applies=_needed,
)
def _define_schemas(model: Any, inputs: dict) -> Undo:
    global _library
    import torch

    library = _library or torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901 - schemas only
    for name, schema in _SCHEMAS.items():
        if not _op_defined(name):
            library.define(schema)
    _library = library
    return lambda: None  # not undone: torchvision, once imported, keeps its fake kernels on these schemas


class _BeforeTorchvision:
    """A ``sys.meta_path`` entry that finds nothing: on the first ``import torchvision`` it takes itself out and
    applies the workaround, then lets the normal finders import torchvision."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "torchvision":
            _remove_hook()
            with applied_workarounds(None, None, {}, ids=[ID]):
                pass  # (the schemas stay: the undo is a no-op)
        return None


def _remove_hook() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _BeforeTorchvision)]


def install_import_hook() -> None:
    """Apply the workaround when torchvision is first imported (nothing if it is imported already)."""
    if "torchvision" not in sys.modules and not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())
