"""The CPU plugin's causal attention for a growing cache's in-graph causal mask, proven from the graph.

transformers builds the causal mask in the traced graph (``kv_idx <= q_idx`` over the cache's positions, expanded to
``[batch, 1, q, kv]``), and an exported ``ScaledDotProductAttention`` takes it as its ``attn_mask``. With that explicit
mask the CPU plugin's stateful attention (``ScaledDotProductAttentionWithKVCache``) is 3.9x slower on a 512-token
prompt than with its own ``causal`` flag (SmolLM2-135M, openvino 2026.3.1: 1724 ms against 443 ms over the 30 layers,
``benchmarks/openvino_causal_prefill_probe.py``), and the recommended OpenVINO recipe (stateful, growing cache, one
IR) then prefills at half eager's speed.

The saved IR keeps the explicit mask: the opset's ``causal`` is top-left aligned (``tril`` of ``[q, kv]``), which
differs from the mask wherever a multi-token call follows a non-empty cache, and a device other than the CPU may
follow the opset. The CPU plugin aligns its causal flag to the end of the keys (each query sees ``kv - q + i + 1``
keys), which is the mask exactly. So :func:`use_plugin_causal` rewrites a copy of the model, at compile time and for
the CPU only, where it proves from the graph that a mask is purely causal:

- it depends on shapes only: every path from a ``Parameter`` or a state into it passes a ``ShapeOf`` (no
  ``attention_mask`` input, no ``cache_position`` values: nothing a caller can make non-causal);
- it compares once (one of ``LessEqual`` / ``Less`` / ``GreaterEqual`` / ``Greater``) and combines nothing (no
  logical or bitwise op, no ``Select``, no division: a sliding window or chunked attention adds a second comparison
  and an ``And``);
- evaluated for several (past length, query length) pairs, past lengths up to 4096 beyond the prompt included, it
  equals the bottom-right causal mask.

Each ``ScaledDotProductAttention`` reading a proven mask becomes one with ``causal=True``. A model that fails any
of the three keeps its mask (a padded batch's export, Gemma's sliding layers, a static cache's slot mask). Only the
plugin's fused stateful attention (``ScaledDotProductAttentionWithKVCache``) aligns ``causal`` to the end of the keys;
its plain attention node does not (measured: a stateless export's prompt lookup, whose multi-token calls follow a
non-empty cache, departs from eager's tokens). So the runner keeps the compiled copy only where every rewritten node
was fused with its state (:func:`fused_with_state`), and compiles the model as saved otherwise.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

__all__ = ["use_plugin_causal", "proven_causal", "fused_with_state"]

logger = logging.getLogger(__name__)

_COMPARISONS = {"LessEqual", "Less", "GreaterEqual", "Greater"}
_COMBINING = {
    "LogicalAnd", "LogicalOr", "LogicalXor", "LogicalNot", "BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot",
    "Select", "Divide", "FloorMod", "Mod", "Equal", "NotEqual", "Minimum", "Maximum",
}
# (past, query) lengths the mask is evaluated at
_PROBES = ((0, 1), (0, 5), (3, 1), (3, 4), (517, 2), (4096, 3))


def _subgraph(output: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """The nodes computing ``output`` above the ``ShapeOf`` nodes; the ``ShapeOf`` inputs' sources they stop at
    (whose shapes only the mask reads), and the ``Parameter`` / ``ReadValue`` nodes reached other than through a
    ``ShapeOf`` (whose values it reads)."""
    nodes, shape_sources, value_sources = [], [], []
    seen: set[str] = set()  # by unique name: each get_node() is a new Python wrapper
    stack = [output.get_node()]
    while stack:
        node = stack.pop()
        if node.get_name() in seen:
            continue
        seen.add(node.get_name())
        nodes.append(node)
        kind = node.get_type_name()
        if kind == "ShapeOf":
            shape_sources.append(node.input_value(0))
            continue
        if kind in ("Parameter", "ReadValue"):
            value_sources.append(node)
            continue
        stack.extend(v.get_node() for v in node.input_values())
    return nodes, shape_sources, value_sources


def _shape_only_comparison(output: Any) -> bool:
    """The structural half of the proof: shapes only, one comparison, nothing combined."""
    nodes, _, values = _subgraph(output)
    kinds = [n.get_type_name() for n in nodes]
    return not values and sum(k in _COMPARISONS for k in kinds) == 1 and not any(k in _COMBINING for k in kinds)


def _evaluated_causal(model: Any, key: str) -> bool:
    """The numeric half: on a copy of ``model`` whose ``ShapeOf`` nodes under the mask read new inputs of the same
    shapes (the mask reads nothing else of them), the mask OpenVINO computes for each of _PROBES equals the
    bottom-right causal mask. Shapes are filled as the decode loop calls the graph: ``[batch, q]`` token inputs,
    ``[batch]`` beam indices, ``[batch, heads, past, dim]`` states, batch 1; an input of another rank is no proof."""
    import openvino as ov
    import openvino.opset13 as ops

    probe = model.clone()
    output = _mask_outputs(probe)[key][0]
    nodes, _, _ = _subgraph(output)
    inputs = []
    for node in nodes:
        if node.get_type_name() != "ShapeOf":
            continue
        source = node.input_value(0)
        shape = source.get_partial_shape()
        if shape.rank.is_dynamic or shape.rank.get_length() not in (1, 2, 4):
            return False
        param = ops.parameter(shape, source.get_element_type())
        node.input(0).replace_source_output(param.output(0))
        inputs.append(param)
    compiled = ov.Core().compile_model(ov.Model([output], inputs, "causal_mask_probe"), "CPU")
    for past, q in _PROBES:
        feeds = []  # in the probe's input order
        for param in inputs:
            dims = list(param.get_output_partial_shape(0))
            if len(dims) == 4:
                shape = [1 if i == 0 else (past if d.is_dynamic else d.get_length()) for i, d in enumerate(dims)]
            else:
                shape = [1, q][: len(dims)]
            feeds.append(np.zeros(shape, dtype=param.get_output_element_type(0).to_dtype()))
        mask = np.asarray(compiled.create_infer_request().infer(feeds)[compiled.output(0)])
        expected = np.tril(np.ones((q, past + q), dtype=bool), k=past)
        if mask.shape[-2:] != expected.shape or not np.array_equal(mask.reshape(-1, q, past + q)[0] != 0, expected):
            return False
    return True


def _mask_outputs(model: Any) -> dict[str, tuple[Any, list[Any]]]:
    """Each attention mask output of ``model`` (by node name and port) and the attention nodes reading it."""
    by_mask: dict[str, tuple[Any, list[Any]]] = {}
    for node in model.get_ordered_ops():
        if node.get_type_name() != "ScaledDotProductAttention" or node.get_input_size() < 4:
            continue
        mask = node.input_value(3)
        key = f"{mask.get_node().get_friendly_name()}:{mask.get_index()}"
        by_mask.setdefault(key, (mask, []))[1].append(node)
    return by_mask


def proven_causal(model: Any) -> dict[str, list[Any]]:
    """The masks of ``model``'s ``ScaledDotProductAttention`` nodes proven purely causal, by the mask node's name:
    the attention nodes reading each."""
    proven = {}
    for key, (mask, nodes) in _mask_outputs(model).items():
        try:
            ok = _shape_only_comparison(mask) and _evaluated_causal(model, key)
        except Exception as exc:  # an unexpected graph is no proof
            logger.debug("no causal proof for %s: %s", key, exc)
            ok = False
        if ok:
            proven[key] = nodes
    return proven


def use_plugin_causal(model: Any) -> tuple[Any, list[str]]:
    """A copy of ``model`` whose attention over a proven causal mask takes the plugin's ``causal`` flag instead, and
    the names of the nodes rewritten; ``(model, [])`` when none is proven (CPU only: see the module docstring; the
    caller checks :func:`fused_with_state` on the compiled copy)."""
    import openvino.opset13 as ops

    if not any(n.get_type_name() == "ScaledDotProductAttention" for n in model.get_ordered_ops()):
        return model, []
    copy = model.clone()
    names = []
    for nodes in proven_causal(copy).values():
        for node in nodes:
            q, k, v = (node.input_value(i) for i in range(3))
            if node.get_input_size() > 4:  # opset13 takes a scale only after a mask, which causal=True ignores
                zero = ops.constant(np.array(0.0, dtype=np.float32), q.get_element_type()).output(0)
                new = ops.scaled_dot_product_attention(q, k, v, zero, node.input_value(4), causal=True)
            else:
                new = ops.scaled_dot_product_attention(q, k, v, causal=True)
            new.set_friendly_name(node.get_friendly_name())
            for target in list(node.output(0).get_target_inputs()):
                target.replace_source_output(new.output(0))
            names.append(node.get_friendly_name())
    if not names:
        return model, []
    copy.validate_nodes_and_infer_types()
    return copy, names


def fused_with_state(compiled: Any, names: list[str]) -> bool:
    """Whether each node of ``names`` runs in ``compiled`` as the plugin's stateful attention (reading its cache
    state itself), the one kernel that aligns ``causal`` to the end of the keys: its plain attention node does not
    (a stateless multi-token call after a non-empty cache then attends top-left: prompt lookup's tokens differ)."""
    ops = compiled.get_runtime_model().get_ordered_ops()
    kind = {op.get_friendly_name(): op.get_rt_info()["layerType"].astype(str) for op in ops}
    fused = {
        op.get_friendly_name() for op in ops
        if kind[op.get_friendly_name()] == "ScaledDotProductAttention"
        and "MemoryInput" in [kind.get(v.get_node().get_friendly_name()) for v in op.input_values()]
    }
    return set(names) <= fused
