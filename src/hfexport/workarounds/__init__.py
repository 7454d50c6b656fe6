"""Workarounds of upstream bugs, as registered, reversible objects (see :mod:`.registry`)."""

from .registry import Workaround, applied_workarounds, register_workaround, workarounds

__all__ = ["Workaround", "applied_workarounds", "register_workaround", "workarounds"]
