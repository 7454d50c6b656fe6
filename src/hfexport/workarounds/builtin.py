"""The built-in workarounds: importing this module registers each of them."""

from .models import mamba  # noqa: F401
