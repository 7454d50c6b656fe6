"""The built-in workarounds. Each lives in its own module per family; this module imports them all."""
