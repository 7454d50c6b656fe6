"""Lower-level functions behind the exporters (import path kept as in the spec: ``hfexport.utils``)."""

from .capture.prepare import get_leaf_tensors, patch_model_config, prepare_for_export, register_export_input_preparer

__all__ = ["get_leaf_tensors", "prepare_for_export", "patch_model_config", "register_export_input_preparer"]
