"""Typed errors: every failure a user can cause says what, where, and what to try.

The classes subclass the built-in exception a caller would naturally catch (``ValueError`` for bad input,
``ImportError`` for a missing package), so code written against the peers keeps working.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

__all__ = [
    "HfExportError",
    "ConfigError",
    "ExportError",
    "UnsupportedError",
    "ManifestError",
    "MissingPackageError",
]


class HfExportError(Exception):
    """Base class of every error hfexport raises on purpose."""


def _bullets(problems: Iterable[str]) -> str:
    return "\n".join(f"  - {p}" for p in problems)


class ConfigError(HfExportError, ValueError):
    """An export config (or the dict it is built from) is wrong; lists every problem at once.

    Example:
        >>> try:
        ...     DynamoConfig.from_dict({"dynamic": "yes", "colour": 1})
        ... except ConfigError as e:
        ...     print(len(e.problems))
        2
    """

    def __init__(self, what: str, problems: Sequence[str]):
        self.what = what
        self.problems = list(problems)
        super().__init__(f"invalid {what} ({len(self.problems)} problem(s)):\n{_bullets(self.problems)}")


class UnsupportedError(HfExportError, ValueError):
    """The model, config or input combination cannot be exported; the message says what to do instead."""


class ManifestError(HfExportError, ValueError):
    """An export directory is missing, corrupt or tampered with; lists every problem found."""

    def __init__(self, directory: str, problems: Sequence[str], total: int | None = None):
        self.directory = directory
        self.problems = list(problems)
        self.total = len(self.problems) if total is None else total  # problems found; ``problems`` may list fewer
        super().__init__(
            f"cannot load the export in {directory!r} ({self.total} problem(s)):\n{_bullets(self.problems)}\n"
            "Re-export the model, or restore the directory from where it was published."
        )


class MissingPackageError(HfExportError, ImportError):
    """A package a backend or quantizer needs is missing or too old; carries the pip line that fixes it."""

    def __init__(self, package: str, needed_by: str, pip_line: str, found: str | None = None, minimum: str | None = None):
        self.package = package
        self.needed_by = needed_by
        self.pip_line = pip_line
        self.found = found
        self.minimum = minimum
        if found is None:
            why = f"{package} is not installed"
        else:
            why = f"{package} {found} is installed but {needed_by} needs >= {minimum}"
        super().__init__(f"{needed_by}: {why}. Install it with:\n    {pip_line}", name=package)


class ExportError(HfExportError, RuntimeError):
    """Tracing or lowering one component failed.

    Carries the component name (``"model"``, ``"decode"``, ...), the class of the submodule being exported, the input
    keys it was traced with and, where we recognise the failure, a hint.
    """

    def __init__(
        self,
        message: str,
        *,
        component: str = "model",
        submodule: str | None = None,
        input_keys: Sequence[str] = (),
        stage: str | None = None,
        hint: str | None = None,
    ):
        self.component = component
        self.submodule = submodule
        self.input_keys = list(input_keys)
        self.stage = stage
        self.hint = hint
        where = f"component {component!r}"
        if submodule:
            where += f" ({submodule})"
        if stage:
            where += f" during {stage}"
        text = f"export of {where} failed: {message}"
        if self.input_keys:
            text += f"\n  traced with inputs: {', '.join(self.input_keys)}"
        if hint:
            text += f"\n  hint: {hint}"
        super().__init__(text)
