"""Quiet by default: what the libraries under us print (warnings, log lines, progress bars, C++ runtime chatter on
file descriptor 2) stays off the terminal unless ``-v``; the command's own lines still reach it.

Python-level noise is turned off where it starts: ``warnings`` filters, the ``torch`` / ``torchao`` /
``transformers`` / ``onnxscript`` / ``nncf`` loggers at ERROR, the Hugging Face progress bars disabled. What C++ code
writes straight to file descriptor 2 (ExecuTorch's cpuinfo lines, ONNX Runtime's and OpenVINO's own warnings) can
only be stopped at the descriptor: when ``sys.stderr`` is the process's real descriptor 2, it is pointed at
``/dev/null`` for the command's duration (Python code writing to ``sys.stderr``, a logging handler or a progress bar,
goes there too), and the command's own lines go to :func:`terminal`, a stream on a copy of the original descriptor.
Under a caller that captured ``sys.stderr`` (a test), only the Python-level noise is turned off and :func:`terminal`
is ``sys.stderr``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["quiet_terminal", "terminal", "NOISY_LOGGERS"]

_terminal: list[Any] = []  # the stream on the saved descriptor 2, while quiet

#: loggers of the libraries under us, set to ERROR in quiet mode
NOISY_LOGGERS = ("torch", "torchao", "transformers", "onnxscript", "onnx_ir", "nncf", "executorch", "openvino",
                 "huggingface_hub", "accelerate", "hfexport")


# read by transformers and huggingface_hub when they are imported later in the command
_QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"}


def terminal() -> Any:
    """Where the command's own messages go: the terminal's stderr even while the libraries' output is silenced."""
    return _terminal[-1] if _terminal else sys.stderr


def _real_stderr() -> bool:
    try:
        return sys.stderr is not None and sys.stderr.fileno() == 2
    except (AttributeError, OSError, io.UnsupportedOperation, ValueError):
        return False


@contextlib.contextmanager
def quiet_terminal(verbose: bool = False) -> Iterator[None]:
    """Keep third-party output off the terminal for the duration (nothing changes with ``verbose``)."""
    if verbose:
        yield
        return
    levels = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    environ = {key: os.environ.get(key) for key in _QUIET_ENV}
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    saved_fd = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in NOISY_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        _quiet_progress_bars()
        if _real_stderr() and not _terminal:  # (a command run by a command, the demo's: already quiet)
            sys.stderr.flush()
            saved_fd = os.dup(2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
            _terminal.append(io.TextIOWrapper(os.fdopen(os.dup(saved_fd), "wb", buffering=0), write_through=True))
        try:
            yield
        finally:
            if saved_fd is not None:
                sys.stderr.flush()
                _terminal.pop().close()
                os.dup2(saved_fd, 2)
                os.close(saved_fd)
            for name, level in levels.items():
                logging.getLogger(name).setLevel(level)
            for key, value in environ.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def _quiet_progress_bars() -> None:
    """transformers' and huggingface_hub's tqdm bars, if those libraries are already imported (an import here would
    load them for a ``--help``); the environment variables above cover a later import."""
    if "transformers" in sys.modules:
        with contextlib.suppress(Exception):
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            hf_logging.set_verbosity_error()
    if "huggingface_hub" in sys.modules:
        with contextlib.suppress(Exception):
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
