"""ONNX: an index along one inner axis (``x[:, positions]``) is a ``Gather`` on that axis, not two full transposes.

torchlib's ``aten_index`` (onnxscript/function_libs/torch_lib/ops/core.py) moves the indexed axes first:
``x[:, t, :]`` becomes ``Transpose(perm=[1, 0, 2])``, ``GatherND``, ``Transpose`` back, each transpose a copy of the
whole tensor. transformers' ``slice_logits_to_keep`` indexes the hidden states so when ``logits_to_keep`` is a tensor
(a multi-token decode exported with ``logits_to_keep_input``), and the LM head's ``MatMul`` then reads the
transposed gather: ONNX Runtime's MatMul/Transpose fusion (``matmul_transpose_fusion.cc``) folds the transpose into a
``FusedMatMul`` with ``transBatchA`` beside a 2-D weight it has also folded a transpose into (a tied head), which its
kernel refuses at run time: "Two inputs should have same rank and rank >= 3 if transBatchA or transBatchB is true"
(SmolLM2's 512-token prompt). In the decomposed program ``torch.onnx`` is about to translate, each ``aten.index.Tensor``
whose one index is a 1-D integer tensor becomes ``aten.index_select`` on that axis (torchlib: one ``Gather``, which
takes negative indices as ``index`` does). Drop it once torchlib gathers a single-axis index in place.
"""

from __future__ import annotations

from typing import Any

from .registry import workaround

__all__ = ["index_as_gather"]


def index_as_gather(program: Any) -> int:
    """Rewrite each single-axis ``aten.index.Tensor`` of ``program`` with a 1-D integer index to
    ``aten.index_select`` on that axis; returns how many nodes changed."""
    from ..capture.graph_passes import rewrite_nodes

    return rewrite_nodes(program, _as_index_select)


def _as_index_select(graph: Any, node: Any) -> bool:
    import torch

    from ..capture.graph_passes import traced

    if node.target is not torch.ops.aten.index.Tensor or len(node.args) != 2:
        return False
    source, indices = node.args
    given = [(axis, index) for axis, index in enumerate(indices) if index is not None]
    if len(given) != 1 or not isinstance(given[0][1], torch.fx.Node):
        return False
    axis, index = given[0]
    value = traced(index)
    if not isinstance(value, torch.Tensor) or value.dim() != 1 or value.dtype not in (torch.int64, torch.int32):
        return False
    node.target, node.args = torch.ops.aten.index_select.default, (source, axis, index)
    return True


@workaround(
    id="onnx-index-one-axis",
    backend="onnx",
    target="onnxscript.function_libs.torch_lib.ops.core.aten_index",
    breaks="x[:, positions] transposes the whole tensor twice around a GatherND, and ONNX Runtime's MatMul/Transpose "
    "fusion turns the LM head after it into a FusedMatMul its kernel refuses (SmolLM2 with logits_to_keep_input and "
    "ort_fusions: 'Two inputs should have same rank and rank >= 3 if transBatchA or transBatchB is true')",
    upstream=None,
    versions={"onnxscript": "<=0.7.0"},
)
def _apply(model: Any, inputs: dict):
    from ..backends.onnx.translations import around_decomposition

    return around_decomposition(after=index_as_gather)
