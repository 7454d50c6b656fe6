"""``ExportedProgram`` -> ``openvino.Model``, with every port named after its signature entry.

``openvino.convert_model`` names a program's parameters after the forward's argument names, which no longer line up
once caches are flattened; its parameters and results do come in the program's flat order. So each parameter is
renamed after ``metadata.inputs[i]`` and each result after ``metadata.user_outputs[j]`` (a cache output gets the
``present.`` prefix: a tensor name is unique within a model, and the cache input already holds the plain one).

When the PyTorch frontend rejects a program, :class:`FrontendError` says which operations (or which check) failed and
what to try; raised inside ``export_program``, it reaches the caller as an ``ExportError`` naming the component.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from ...errors import ExportError
from ...metadata import ExportMetadata, IORole

__all__ = ["convert", "name_ports", "input_names", "output_names", "FrontendError", "explain_frontend_failure",
           "PRESENT"]

PRESENT = "present."
RETURNED = "returned."


def input_names(metadata: ExportMetadata) -> list[str]:
    return [s.name for s in metadata.inputs]


def output_names(metadata: ExportMetadata) -> list[str]:
    """The output ports' names: a cache output's under :data:`PRESENT`, an output named like an input (UDOP's
    encoder returns its ``attention_mask``) under :data:`RETURNED` (a model's tensor names are unique: naming the
    output took the name off the input, which the runner then could not feed)."""
    taken = set(input_names(metadata))
    return [PRESENT + s.name if s.role is IORole.CACHE_OUTPUT else RETURNED + s.name if s.name in taken else s.name
            for s in (*metadata.user_outputs, *metadata.checks)]


class FrontendError(RuntimeError):
    """``openvino.convert_model`` rejected a traced program: the operations (or the frontend check) that failed and
    what to try, followed by the frontend's own message."""


def convert(program: torch.export.ExportedProgram) -> Any:
    """``openvino.convert_model`` (looked up at call time, so that the registered workarounds wrapping it apply).

    Raises:
        FrontendError: The PyTorch frontend could not convert the program.
    """
    import openvino as ov

    try:
        return ov.convert_model(program)
    except Exception as e:  # noqa: BLE001 - the frontend raises its own (pybind) types
        raise FrontendError(explain_frontend_failure(e, ov.__version__)) from e


def explain_frontend_failure(error: BaseException, version: str) -> str:
    """The cause of a PyTorch frontend failure in one line, what to try, then the frontend's message."""
    text = str(error)
    failed = sorted({op.strip() for line in re.findall(r"(?:Conversion is failed for|No conversion rule found for "
                                                        r"operations):\s*(.+)", text) for op in line.split(",")})
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    version = version.split("-")[0]  # (2026.3.1, not its build hash: the op names come first in a short line)
    if failed:
        cause = f"OpenVINO {version}'s PyTorch frontend cannot convert {', '.join(failed)} as torch.export emits it"
    else:
        cause = f"OpenVINO {version}'s PyTorch frontend failed: {lines[-1] if lines else type(error).__name__}"
    return (f"{cause}. Try: another backend for this component (dynamo, onnx); a newer openvino; or a workaround "
            "rewriting the op before conversion (see hfexport.workarounds.openvino_index_add). Frontend message: "
            + " | ".join(lines))


def name_ports(model: Any, metadata: ExportMetadata, program: Any = None) -> Any:
    """Name the ports of a converted ``model`` from ``metadata`` (in place); returns it.

    A user input the program kept as a placeholder without a tensor (an ``attention_mask=None``) became a parameter
    of no type: it is removed (the signature has no entry for it). The frontend drops some of the inputs the traced
    ``program`` never reads: their names are skipped.
    """
    _drop_non_tensor_inputs(model, metadata)
    params, results = model.get_parameters(), model.get_results()
    names_in, names_out = input_names(metadata), output_names(metadata)
    if len(params) < len(names_in) and len(results) == len(names_out):
        names_in = _read_by_program(program, params, metadata) or _read_inputs(params, names_in)
    if len(params) != len(names_in) or len(results) != len(names_out):
        raise ExportError(
            f"openvino.convert_model gave {len(params)} inputs and {len(results)} outputs; the traced signature has "
            f"{len(names_in)} and {len(names_out)}",
            stage="convert",
            hint="a graph input or output that is not a tensor (or an unused one) was dropped by the converter",
        )
    for param, name in zip(params, names_in):
        param.set_friendly_name(name)
        param.output(0).get_tensor().set_names({name})
    named: set[tuple[str, int]] = set()
    for result, name in zip(results, names_out):
        source = result.input_value(0)
        key = (source.get_node().get_name(), source.get_index())
        if source.get_node().get_type_name() == "Parameter" or key in named:
            # a pass-through (an unchanged cross-attention cache) or an output returned twice: give the result a
            # tensor of its own, so that naming it does not rename the input (or the other output)
            source = _identity(source)
            result.input(0).replace_source_output(source)
        named.add((source.get_node().get_name(), source.get_index()))
        result.set_friendly_name(name)
        source.get_tensor().set_names({name})
        result.output(0).get_tensor().set_names({name})  # a Result holds its own names (OpenVINO >= 2025)
    model.validate_nodes_and_infer_types()
    return model


def _read_by_program(program: Any, params: list[Any], metadata: ExportMetadata) -> list[str] | None:
    """The input names of ``params`` when the frontend dropped some of the user inputs the traced ``program`` never
    reads (a mask of a layer type the model has no layer of: Inkling's full-attention mask; it keeps some unread
    ones): the one choice of unread inputs whose removal leaves the parameters' dtypes and ranks, in order; None
    when no choice or several fit."""
    import itertools

    import numpy as np

    names = input_names(metadata)
    wanted = set(program.graph_signature.user_inputs) if program is not None else set()
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder" and n.name in wanted] if wanted else []
    if len(placeholders) != len(names) or len(params) >= len(names):
        return None
    unread = [i for i, node in enumerate(placeholders) if not node.users]
    kinds = [(np.dtype(p.get_element_type().to_dtype()).name, p.get_partial_shape().rank.get_length()) for p in params]
    specs = [(s.dtype, len(s.shape)) for s in metadata.inputs]
    fits = [set(dropped) for dropped in itertools.combinations(unread, len(names) - len(params))
            if [specs[i] for i in range(len(names)) if i not in dropped] == kinds]
    return [n for i, n in enumerate(names) if i not in fits[0]] if len(fits) == 1 else None


def _read_inputs(params: list[Any], names: list[str]) -> list[str]:
    """The input names of ``params`` when the frontend dropped inputs the graph never reads (a vision tower given
    ``input_ids`` it takes in ``**kwargs``: Idefics3's, SmolVLM's) and kept the traced names on the others: those
    names, in the parameters' order (the runner feeds by name, and feeds nothing to a dropped input). Otherwise
    ``names`` unchanged, for the caller to refuse."""
    kept = [next((n for n in names if n in p.output(0).get_names()), None) for p in params]
    return [n for n in kept if n is not None] if all(kept) and len(set(kept)) == len(kept) else names


def _drop_non_tensor_inputs(model: Any, metadata: ExportMetadata) -> None:
    import openvino as ov

    if len(model.get_parameters()) <= len(metadata.inputs):
        return
    for param in model.get_parameters():
        # the frontend runs program.module(), whose signature still has the None input: a parameter of no type
        # that nothing reads
        if param.get_element_type() == ov.Type.dynamic and not param.output(0).get_target_inputs():
            model.remove_parameter(param)


def _identity(source: Any) -> Any:
    import numpy as np
    import openvino.opset13 as ops

    element = source.get_element_type()
    if element.is_real():
        return ops.multiply(source, ops.constant(np.array(1, dtype=element.to_dtype()))).output(0)
    return ops.convert(source, element).output(0)
