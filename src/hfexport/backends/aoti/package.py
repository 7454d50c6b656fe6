"""An AOTInductor package and the weights it runs with: compiled, checked, saved once, loaded.

With ``gemm="cpp"`` the weights are frozen into the graph and prepacked for Inductor's GEMM micro-kernels: they are
constants of the library, each package carries its own (one package for a static-cache multi-token decode, which
serves the prompt too), and torch 2.13's AOTInductor keeps the original weights in the library as well, as constants
the frozen graph no longer reads (2x the weights per package; measured on SmolLM2: 1083 MB for 538 MB). With ``gemm="aten"`` they stay plain: Inductor's default would still put every weight
inside the package's shared library, so a prefill and a decode package of one model would each carry all of them (a
2x folder, twice the memory). Here the library is then built without them
(``aot_inductor.package_constants_in_so=False``) and fed the tensors at load (``load_constants(...,
user_managed=True)``: no copy). On disk they go once into ``aoti_weights.safetensors`` beside the packages, its
header saying which of each package's constants is which stored tensor; every package of the folder then runs on
one copy in memory.

``aoti_load_package`` unzips the package into a temporary folder and ``dlopen``s its library, so before it is ever
called :func:`check_package` refuses any member that is not one AOTInductor writes (a name that would unzip outside
that folder, an unexpected library, a link).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import threading
import weakref
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from ...errors import ManifestError
from ...manifest import listed_files, reference_problem

__all__ = ["AotiProgram", "WEIGHTS_NAME", "CPP_GEMM", "inductor_options", "compile_package", "check_package", "save_weights", "load_weights"]

WEIGHTS_NAME = "aoti_weights.safetensors"
# what aoti_compile_and_package writes under its one top folder (torch 2.13): the archive's bookkeeping, and the
# compiled model's sources, metadata and library under data/aotinductor/<model>/
_FIXED = {"archive_format", "archive_version", "byteorder", ".data/version", ".data/serialization_id"}
_MODEL_SUFFIXES = (".cpp", ".so", ".json", ".h", ".o", ".ubj")


class AotiProgram:
    """A compiled package (``package``: its ``.pt2`` file) and its weights by constant name.

    ``exported_program`` is the ``torch.export`` graph it was compiled from, where it is at hand (right after the
    export; not saved). :meth:`load` loads the library, once, and hands it the weights.
    """

    def __init__(self, package: Path, weights: Mapping[str, torch.Tensor], *, exported_program: Any = None,
                 owned: Path | None = None):
        self.package = Path(package)
        self.weights = dict(weights)
        self.exported_program = exported_program
        self._loaded: Any = None
        self._lock = threading.Lock()
        if owned is not None:  # a temporary folder holding the freshly compiled package: removed with the object
            weakref.finalize(self, shutil.rmtree, str(owned), True)

    def __repr__(self) -> str:
        return f"AotiProgram({self.package.name}, {len(self.weights)} weights)"

    def load(self) -> Any:
        """The loaded ``AOTICompiledModel``, its constants bound to :attr:`weights` (which this object keeps)."""
        with self._lock:
            if self._loaded is None:
                compiled = torch._inductor.aoti_load_package(str(self.package))
                if not self.weights:  # frozen weights: prepacked constants inside the library
                    self._loaded = compiled
                    return compiled
                names = compiled.get_constant_fqns()
                missing = [n for n in names if n not in self.weights]
                if missing:
                    raise ManifestError(str(self.package), [f"no stored weight for constants {missing[:5]}"
                                                            f"{' ...' if len(missing) > 5 else ''}"])
                compiled.load_constants({n: self.weights[n] for n in names}, check_full_update=True,
                                        user_managed=True)
                self._loaded = compiled
            return self._loaded


#: ``gemm="cpp"``: Inductor's C++ GEMM template competes with torch's mm at compile time (its micro-kernels won
#: every SmolLM2 shape here, 5-7x), on weights frozen into the graph and prepacked for them
CPP_GEMM = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN",
            # the autotuner's per-shape tables go to stderr: not the user's concern
            "max_autotune_report_choices_stats": False, "autotune_num_choices_displayed": 0}


def inductor_options(gemm: str, inductor_configs: Mapping[str, Any] | None) -> dict[str, Any]:
    """The Inductor options of a compile: what ``gemm`` needs, the user's own over them, and where the weights go
    (frozen weights are prepacked constants of the library; otherwise they stay out of it)."""
    options = {**(CPP_GEMM if gemm == "cpp" else {}), **(inductor_configs or {})}
    options["aot_inductor.package_constants_in_so"] = bool(options.get("freezing"))
    return options


def compile_package(program: torch.export.ExportedProgram, options: Mapping[str, Any]) -> AotiProgram:
    """Compile ``program`` into a package in a temporary folder (kept as long as the returned object lives), with
    the options of :func:`inductor_options`."""
    folder = Path(tempfile.mkdtemp(prefix="hfexport-aoti-"))
    path = torch._inductor.aoti_compile_and_package(program, package_path=str(folder / "model.pt2"),
                                                    inductor_configs=dict(options))
    weights = {}
    if not options.get("aot_inductor.package_constants_in_so"):
        weights = {**program.state_dict, **program.constants}
        weights = {name: _stored(t) for name, t in weights.items() if isinstance(t, torch.Tensor)}
    return AotiProgram(Path(path), weights, exported_program=program, owned=folder)


def _stored(tensor: torch.Tensor) -> torch.Tensor:
    data = tensor.detach()
    return data if data.is_contiguous() else data.contiguous()


def check_package(path: Path) -> None:
    """Refuse a package with a member AOTInductor does not write, every problem listed (nothing is extracted)."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as e:
        raise ManifestError(str(path), [f"{path.name}: not a .pt2 package ({e})"]) from None
    problems, libraries = [], []
    with archive:
        infos = archive.infolist()
        tops = {PurePosixPath(i.filename).parts[0] for i in infos if PurePosixPath(i.filename).parts}
        if len(tops) != 1:
            problems.append(f"{path.name}: members under {sorted(tops)[:4]}; a package has one top folder")
        for info in infos:
            name = info.filename
            parts = PurePosixPath(name).parts
            if name.startswith("/") or "\\" in name or ".." in parts or ":" in name:
                problems.append(f"{path.name}: member {name!r} would unzip outside the package's folder")
                continue
            if stat.S_ISLNK(info.external_attr >> 16):
                problems.append(f"{path.name}: member {name!r} is a symbolic link")
                continue
            inner = "/".join(parts[1:])
            model = parts[1:4] if len(parts) == 5 else ()
            if inner in _FIXED or info.is_dir():
                continue
            if model[:2] == ("data", "aotinductor") and name.endswith(_MODEL_SUFFIXES):
                libraries += [name] if name.endswith(".so") else []
                continue
            problems.append(f"{path.name}: member {name!r} is not one AOTInductor writes for a CPU package "
                            "(hfexport keeps the weights outside the package)")
    if len(libraries) != 1 and not problems:
        problems.append(f"{path.name}: {len(libraries)} shared libraries; a package holds one")
    if problems:
        raise ManifestError(str(path), problems)


def save_weights(programs: Sequence[AotiProgram], names: Sequence[str], directory: Path) -> None:
    """Write the weights of ``programs`` (saved as ``names``) once into :data:`WEIGHTS_NAME` in ``directory``."""
    from safetensors.torch import save_file

    keys: dict[tuple, str] = {}
    tensors: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    header: dict[str, str] = {}
    for program, name in zip(programs, names):
        mapping = {}
        for fqn, tensor in program.weights.items():
            ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                     tensor.stride(), tensor.dtype)
            if ident not in keys:
                keys[ident] = key = f"w{len(keys)}"
                # safetensors stores tensors that share no memory with another key
                tensors[key] = tensor.clone() if ident[0] in storages else tensor
                storages.add(ident[0])
            mapping[fqn] = keys[ident]
        header[name] = json.dumps(mapping)
    save_file(tensors, str(Path(directory) / WEIGHTS_NAME), metadata=header)


def load_weights(path: Path, cache: dict[Path, Any]) -> dict[str, torch.Tensor]:
    """The weights of the package at ``path``, by constant name, from the folder's :data:`WEIGHTS_NAME` (read once
    per folder into ``cache``, so the folder's packages share one copy)."""
    folder = Path(path).parent
    location = folder / WEIGHTS_NAME
    if location not in cache:
        if not os.path.lexists(location):
            raise ManifestError(str(path), [f"{WEIGHTS_NAME} is missing beside it (it holds the package's weights)"])
        bad = reference_problem(folder, WEIGHTS_NAME, listed_files(folder))
        if bad:
            raise ManifestError(str(path), [f"its weights: {bad}"])
        from safetensors import safe_open
        from safetensors.torch import load_file

        with safe_open(str(location), framework="pt") as handle:
            header = handle.metadata() or {}
        cache[location] = (load_file(str(location)), header)
    tensors, header = cache[location]
    try:
        mapping = json.loads(header[Path(path).name])
    except (KeyError, ValueError):
        mapping = None
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise ManifestError(str(location), [f"its header names no weights for {Path(path).name}"])
    missing = sorted({k for k in mapping.values() if k not in tensors})
    if missing:
        raise ManifestError(str(location), [f"{Path(path).name}: no stored tensor {missing[:5]}"])
    return {fqn: tensors[key] for fqn, key in mapping.items()}
