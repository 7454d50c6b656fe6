"""The float weights of an OpenVINO model's matrix products, for the passes that compress them by hand
(:mod:`.openvino_groups`, NNCF's weight-only layers in :mod:`.nncf`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["float_matmul_weights"]


def float_matmul_weights(model: Any, wanted: Callable[[str], bool]) -> Iterator[tuple[Any, Any, Any, Any]]:
    """``(matmul, weight_port, constant, data)`` for each ``MatMul`` of ``model`` whose friendly name ``wanted``
    accepts and whose weight (second input) is a 2-D f32 ``Constant``; ``data`` is its numpy array (read-only)."""
    import openvino as ov

    for op in model.get_ordered_ops():
        if op.get_type_name() != "MatMul" or not wanted(op.get_friendly_name()):
            continue
        port = op.input(1)
        source = port.get_source_output().get_node()
        if source.get_type_name() != "Constant" or source.get_element_type() != ov.Type.f32:
            continue
        data = source.get_data()
        if data.ndim == 2:
            yield op, port, source, data
