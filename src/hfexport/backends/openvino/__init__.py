"""The OpenVINO backend: ``openvino.convert_model`` of the traced program, run on OpenVINO Runtime.

Modules, one concern each:

- :mod:`.convert`: ``ExportedProgram`` -> ``openvino.Model``, its ports named from the typed signature.
- :mod:`.stateful`: round-tripped state (KV cache, SSM states) folded into ``ReadValue``/``Assign`` variables, with a
  fused ``beam_idx`` reorder.
- :mod:`.exporter` / :mod:`.runner`: the backend's ``HfExporter`` and ``ModelRunner``.
"""

from .exporter import OpenVINOExporter
from .runner import OpenVINORunner

__all__ = ["OpenVINOExporter", "OpenVINORunner"]
