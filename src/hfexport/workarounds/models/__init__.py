"""Model-specific workarounds, one module per ``model_type``."""
