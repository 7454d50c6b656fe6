"""ONNX Runtime's ``matmul_nbits_quantizer`` module configures the process's root logger when it is imported.

``onnxruntime/quantization/matmul_nbits_quantizer.py`` calls ``logging.basicConfig(level=logging.INFO)`` at import:
from then on every INFO record of every library in the user's process is printed to stderr (the quantizer alone
prints two lines per node of the graph: thousands for a small LLM), and a later ``basicConfig`` of the user's own
does nothing. This imports the module with the root logger's level and handlers put back as they were, and keeps the
quantizer's own logger at WARNING while it runs. Applied by ``OnnxRuntimeQuantizer`` around
``MatMulNBitsQuantizer`` (``applies`` wants an ONNX model). Drop it once the module leaves logging to the
application.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .quantize_ort_attention import is_onnx_model
from .registry import workaround

__all__ = ["import_quietly"]

MODULE = "onnxruntime.quantization.matmul_nbits_quantizer"


def import_quietly() -> Any:
    """Import ``MODULE`` (first time: with the root logger's configuration restored after its ``basicConfig``)."""
    import importlib

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        return importlib.import_module(MODULE)
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)


@workaround(
    id="onnxruntime-nbits-root-logging",
    backend="onnx",
    target=f"{MODULE} (logging.basicConfig at import)",
    breaks="importing ONNX Runtime's MatMulNBits quantizer sets the root logger to INFO with a stderr handler: "
    "every library's INFO records get printed, two lines per quantized node",
    upstream=None,
    versions={"onnxruntime": ">=1.21,<1.33"},
    applies=is_onnx_model,
)
def _apply(model: Any, inputs: dict) -> Callable[[], None]:
    import_quietly()
    quantizer_logger = logging.getLogger(MODULE)
    level = quantizer_logger.level
    quantizer_logger.setLevel(max(level, logging.WARNING))
    return lambda: quantizer_logger.setLevel(level)
