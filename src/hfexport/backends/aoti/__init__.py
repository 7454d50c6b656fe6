"""The AOTInductor backend: the ``torch.export`` graph compiled ahead of time into a ``.pt2`` package.

The package holds a shared library built for this machine (``-march=native``) and this torch; its weights are kept
out of the library and stored once beside the packages (``aoti_weights.safetensors``), so a prefill and a decode
package share them on disk and in memory.
"""

from .exporter import AotiExporter
from .runner import AotiRunner

__all__ = ["AotiExporter", "AotiRunner"]
