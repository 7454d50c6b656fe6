"""The ONNX backend: ``torch.onnx.export`` of the traced program, run on ONNX Runtime with io-binding.

Modules, one concern each:

- :mod:`.names`: the graph's input/output names, derived from the typed signature (``input.<name>`` /
  ``output.<name>`` for cache tensors).
- :mod:`.convert`: ``ExportedProgram`` -> ``onnx_ir.Model`` and the naming of its I/O.
- :mod:`.translations`: ONNX translations for ops torchlib lacks (MoE grouped matmul).
- :mod:`.optimize`: the onnxscript optimiser passes.
- :mod:`.fusions`: rewrites into ONNX Runtime contrib ops (``OnnxConfig(ort_fusions=...)``).
- :mod:`.storage`: ``model.onnx`` + external data, weights shared between components.
- :mod:`.session`: an ONNX Runtime session for a program (from its file, or from memory).
- :mod:`.inplace`: which cache outputs may be written into their input's buffer.
- :mod:`.exporter` / :mod:`.runner`: the backend's ``HfExporter`` and ``ModelRunner``.
"""

from .exporter import OnnxExporter
from .runner import OnnxRunner

__all__ = ["OnnxExporter", "OnnxRunner"]
