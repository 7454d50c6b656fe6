"""The names of an ONNX graph's inputs and outputs, derived from the typed signature alone.

Both the exporter (naming the graph) and the runner (binding tensors) call :func:`io_names` on the same metadata, so
tensors are matched by their position in the signature, never by parsing names. Cache tensors are named as ONNX
Runtime decode loops expect: ``input.<name>`` for a cache input and ``output.<name>`` for the cache output of the
same slot, e.g. ``input.past_key_values.layers.0.keys`` / ``output.past_key_values.layers.0.keys``.
"""

from __future__ import annotations

from ...metadata import ExportMetadata, IORole

__all__ = ["CACHE_INPUT_PREFIX", "CACHE_OUTPUT_PREFIX", "io_names", "in_place_pairs"]

CACHE_INPUT_PREFIX = "input."
CACHE_OUTPUT_PREFIX = "output."


def io_names(metadata: ExportMetadata) -> tuple[list[str], list[str]]:
    """ONNX names of the graph's inputs (``metadata.inputs`` order) and outputs (``metadata.user_outputs`` order, then
    ``metadata.checks``).

    A plain output whose name is also an input's is prefixed like a cache output, so every name is unique.

    Example:
        >>> inputs, outputs = io_names(exported.components["decode"].metadata)
        >>> inputs[:2], outputs[:2]
        (['input_ids', 'input.past_key_values.layers.0.keys'], ['logits', 'output.past_key_values.layers.0.keys'])
    """
    inputs = [
        f"{CACHE_INPUT_PREFIX}{s.name}" if s.role is IORole.CACHE_INPUT else s.name for s in metadata.inputs
    ]
    taken = set(inputs)
    outputs = []
    for spec in metadata.user_outputs:
        name = spec.name or "output"  # a graph that returns a bare tensor: its one leaf has no path
        if spec.role is IORole.CACHE_OUTPUT or name in taken:
            name = f"{CACHE_OUTPUT_PREFIX}{name}"
        outputs.append(name)
    outputs += [spec.name for spec in metadata.checks]  # (the runner checks them: ModelRunner.checked)
    return inputs, outputs


def in_place_pairs(metadata: ExportMetadata) -> dict[int, int]:
    """``{output index: input index}`` for cache outputs that are the new value of a cache input the graph updates
    in place (a static cache): same slot name, dtype and shape. Indices are into ``metadata.user_outputs`` and
    ``metadata.inputs``."""
    mutated = {
        s.name: i for i, s in enumerate(metadata.inputs) if s.role is IORole.CACHE_INPUT and s.mutated
    }
    pairs = {}
    for out_index, spec in enumerate(metadata.user_outputs):
        in_index = mutated.get(spec.name)
        if spec.role is not IORole.CACHE_OUTPUT or in_index is None:
            continue
        source = metadata.inputs[in_index]
        if source.dtype == spec.dtype and list(source.shape) == list(spec.shape):
            pairs[out_index] = in_index
    return pairs
