"""ExecuTorch: keep a lifted scalar constant's placeholder where ``to_edge`` puts it in the graph signature.

``to_edge`` turns a Python scalar operand into a 0-d tensor constant (``ScalarToTensorPass``: Whisper's
``q_proj(x) * self.scaling``) and ``lift_constant_tensor_pass`` (executorch/exir/program/_program.py) lifts it
to a buffer placeholder. The pass puts the new spec before the signature's first user input, but the placeholder
before the first graph placeholder whose *name* is in ``graph_signature.user_inputs``; that collection holds the
*value* of an input traced as a constant (``attention_mask=None`` -> ``None``), so when such an input comes first
(Whisper's encoder is called with ``attention_mask=None``; Qwen2-VL's text model too) the placeholder lands after
it and the verifier refuses the program: "Input spec name _lifted_tensor_constant0 does not match node name
attention_mask". This wraps the pass: after it runs, the placeholders are put in the signature's order (a no-op
where they already are). Seen with executorch 1.5.1; no upstream issue known (torch's own lift pass had the same
mistake, fixed in pytorch/pytorch#157719); drop it once the executorch pass finds the first user input by spec.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from .registry import patch_attribute, workaround

__all__ = ["order_placeholders", "has_constant_input"]

_MODULE = "executorch.exir.program._program"
_CONSTANT_TYPES = (type(None), bool, int, float, str)


def order_placeholders(program: torch.export.ExportedProgram) -> bool:
    """Move ``program``'s placeholders into the order of its signature's input specs, in place; returns whether any
    moved. A graph whose placeholders and specs do not name the same nodes is left for the verifier to report."""
    graph = program.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    by_name = {n.name: n for n in placeholders}
    wanted = [by_name.get(getattr(spec.arg, "name", None)) for spec in program.graph_signature.input_specs]
    if wanted == placeholders or None in wanted or len(set(wanted)) != len(placeholders):
        return False
    first_op = next(n for n in graph.nodes if n.op != "placeholder")  # the output node at the latest
    for node in wanted:
        first_op.prepend(node)
    program.graph_module.recompile()
    return True


def has_constant_input(model: Any, inputs: dict) -> bool:
    """Whether an input is traced as a constant (``None``, a bool, a number, a string): the only case in which
    ``graph_signature.user_inputs`` lacks a placeholder's name."""
    return any(isinstance(value, _CONSTANT_TYPES) for value in inputs.values())


@workaround(
    id="executorch-lifted-constant-order",
    backend="executorch",
    target=f"{_MODULE}.lift_constant_tensor_pass",
    breaks="a scalar operand lifted to a constant by to_edge (Whisper's attention scaling) gets its placeholder "
    "after an input traced as a constant (attention_mask=None), and the verifier refuses the program: 'Input spec "
    "name _lifted_tensor_constant0 does not match node name attention_mask'",
    upstream="executorch/exir/program/_program.py lift_constant_tensor_pass (first user input looked up by name in "
    "graph_signature.user_inputs); no issue known",
    versions={"executorch": ">=1.0,<1.6"},
    applies=has_constant_input,
)
def _apply(model: Any, inputs: dict):
    module = importlib.import_module(_MODULE)
    original = module.lift_constant_tensor_pass

    def lift_constant_tensor_pass(program: Any) -> Any:
        program = original(program)
        order_placeholders(program)
        return program

    return patch_attribute(module, "lift_constant_tensor_pass", lift_constant_tensor_pass)
