"""ONNX Runtime sessions for programs: from the saved file when there is one, else from the model in memory.

Components served by one graph (a static-cache prefill run by the multi-token decode graph) share one program
object, and so one session: its weights are loaded once.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from pathlib import Path
from typing import Any

import onnx_ir as ir

__all__ = ["PATH_KEY", "session_for", "default_providers", "check_providers"]

PATH_KEY = "hfexport.path"
"""``model.meta`` key of the file a loaded program was read from (delete it after editing the program in memory)."""

_PROTO_LIMIT = 1_800_000_000  # stay clear of protobuf's 2 GB message limit
_CUDA_PROVIDERS = ("CUDAExecutionProvider", "TensorrtExecutionProvider", "NvTensorRTRTXExecutionProvider")
_sessions: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def default_providers(device: Any = None) -> list[str]:
    """The execution provider for ``device``: CPU by default, CUDA for a ``cuda`` device."""
    kind = str(device).split(":")[0] if device is not None else "cpu"
    if kind == "cuda":
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if kind != "cpu":
        raise ValueError(f"the ONNX backend runs on 'cpu' or 'cuda', got device={device!r}")
    return ["CPUExecutionProvider"]


def check_providers(providers: list, device: Any = None) -> None:
    """Raise where this ONNX Runtime lacks the provider that ``device`` runs on.

    ONNX Runtime itself only warns for a provider it does not have and runs the graph on the next one (the CPU), so a
    CUDA runner would bind GPU tensors to a CPU session and fail at the first call with an error that names neither.
    """
    import onnxruntime as ort

    from ...errors import UnsupportedError

    kind = str(device).split(":")[0] if device is not None else "cpu"
    if kind != "cuda":
        return
    names = [p[0] if isinstance(p, (tuple, list)) else p for p in providers]
    gpu = [n for n in names if n in _CUDA_PROVIDERS]
    if not gpu:
        raise UnsupportedError(
            f"device={device!r} binds inputs and outputs on the GPU, and providers={names} names no CUDA provider "
            f"({', '.join(_CUDA_PROVIDERS)}); add one, or leave providers to the default for the device"
        )
    available = ort.get_available_providers()
    if not any(n in available for n in gpu):
        raise UnsupportedError(
            f"device={device!r} needs ONNX Runtime's {gpu[0]}, and this onnxruntime ({ort.__version__}) has only "
            f"{available}. Install the GPU build in its place: pip uninstall -y onnxruntime && pip install "
            f"'onnxruntime-gpu=={ort.__version__}'; or run on device='cpu'"
        )


def session_for(program: ir.Model, providers: list | None, session_options: Any = None) -> Any:
    """An ``onnxruntime.InferenceSession`` for ``program``, shared by every runner of that program object with the
    same providers and options."""
    import onnxruntime as ort

    key = (repr(providers), id(session_options))
    cached = _sessions.setdefault(program, {})
    entry = cached.get(key)
    session = entry[0]() if entry is not None else None
    if session is not None:
        return session
    path = program.meta.get(PATH_KEY)
    if path and os.path.isfile(path):
        session = ort.InferenceSession(path, sess_options=session_options, providers=providers)
    else:
        session = _from_memory(program, providers, session_options)
    # held weakly (the runners hold it): a session lives as long as a runner uses it. The options object is kept
    # with the entry, so that its id cannot be taken by another object while the entry exists.
    cached[key] = (weakref.ref(session), session_options)
    return session


def _from_memory(program: ir.Model, providers: list | None, session_options: Any) -> Any:
    import onnxruntime as ort

    proto = ir.to_proto(program)
    if proto.ByteSize() < _PROTO_LIMIT:
        return ort.InferenceSession(proto.SerializeToString(), sess_options=session_options, providers=providers)
    # too large for one protobuf message: write it with external data; the session reads it all in, so the
    # folder can go once the session exists
    with tempfile.TemporaryDirectory(prefix="hfexport-onnx-") as tmp:
        path = Path(tmp) / "model.onnx"
        ir.save(program, path, external_data="model.onnx.data")
        return ort.InferenceSession(str(path), sess_options=session_options, providers=providers)
