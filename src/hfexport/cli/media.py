"""Images and audio for the command line: files read for ``hfexport run --image / --audio``, the prompt that holds
an image placeholder, and the synthetic image / audio ``hfexport export`` traces a multimodal model with.

Reading a file is the only thing written here by hand: decoding goes to Pillow (any format it opens) and to SciPy
(WAV, integer or float PCM; resampled with ``scipy.signal.resample_poly``, a polyphase filter), and everything
after that (resizing, normalising, mel features, image placeholder tokens) to the model's own processor. Neither
package is a dependency of the library (both are in the ``media`` extra): a missing one is refused with the
tested pip line. Formats other than WAV are refused with the ffmpeg line that converts them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._versions import pip_line
from ..errors import MissingPackageError, UnsupportedError

__all__ = ["load_image", "load_audio", "synthetic_image", "synthetic_audio", "image_prompt", "processor_parts"]



def _require(module: str, package: str, purpose: str) -> Any:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingPackageError(package, purpose, pip_line([package])) from None


def load_image(path: Path) -> Any:
    """The image at ``path`` as an RGB ``PIL.Image`` (any format Pillow reads); a clear error naming the file when
    it is missing or is not an image."""
    path = Path(path)
    if not path.is_file():
        raise UnsupportedError(f"--image {path}: no such file")
    image_module = _require("PIL.Image", "pillow", "--image")
    try:
        with image_module.open(path) as image:
            return image.convert("RGB")
    except (OSError, ValueError, image_module.DecompressionBombError) as e:
        raise UnsupportedError(f"--image {path}: not an image Pillow can read ({type(e).__name__}: {e})") from e


def load_audio(path: Path, sampling_rate: int) -> Any:
    """The WAV file at ``path`` as mono float32 samples in [-1, 1] at ``sampling_rate`` (the feature extractor's):
    channels are averaged, integer PCM is scaled by its type's range, other rates are resampled."""
    import numpy as np

    path = Path(path)
    if not path.is_file():
        raise UnsupportedError(f"--audio {path}: no such file")
    if path.suffix.lower() not in (".wav", ".wave"):
        raise UnsupportedError(
            f"--audio {path}: only WAV files are read; convert it first, e.g. "
            f"ffmpeg -i {path} -ac 1 -ar {sampling_rate} {path.with_suffix('.wav')}"
        )
    wavfile = _require("scipy.io.wavfile", "scipy", "--audio")
    try:
        rate, data = wavfile.read(path)
    except (OSError, ValueError) as e:
        raise UnsupportedError(f"--audio {path}: not a WAV file SciPy can read ({type(e).__name__}: {e})") from e
    if data.size == 0:
        raise UnsupportedError(f"--audio {path}: the file holds no samples")
    if np.issubdtype(data.dtype, np.integer):
        info = np.iinfo(data.dtype)
        if info.min == 0:  # unsigned (8-bit WAV): centred on the middle of the range
            data = (data.astype(np.float64) - (info.max + 1) / 2) / ((info.max + 1) / 2)
        else:
            data = data.astype(np.float64) / -float(info.min)
    data = np.asarray(data, dtype=np.float64)
    if data.ndim == 2:
        data = data.mean(axis=1)
    if rate != sampling_rate:
        signal = _require("scipy.signal", "scipy", "--audio")
        from math import gcd

        g = gcd(int(rate), int(sampling_rate))
        data = signal.resample_poly(data, int(sampling_rate) // g, int(rate) // g)
    return data.astype(np.float32)


def synthetic_image(processor: Any, index: int = 0) -> Any:
    """A seeded random-noise RGB image (``PIL.Image``) at the size the image processor crops or resizes to."""
    import numpy as np

    image_module = _require("PIL.Image", "pillow", "exporting an image-text-to-text model")
    height, width = _image_size(getattr(processor, "image_processor", None))
    pixels = np.random.default_rng(index).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return image_module.fromarray(pixels, mode="RGB")


def _image_size(image_processor: Any) -> tuple[int, int]:
    for attr in ("crop_size", "size"):
        size = getattr(image_processor, attr, None)
        if isinstance(size, dict):
            if "height" in size and "width" in size:
                return int(size["height"]), int(size["width"])
            if "shortest_edge" in size:
                return int(size["shortest_edge"]), int(size["shortest_edge"])
        elif isinstance(size, int):
            return size, size
    return 224, 224


def synthetic_audio(sampling_rate: int, seconds: float = 1.0) -> Any:
    """``seconds`` of seeded quiet noise (float32 mono at ``sampling_rate``)."""
    import numpy as np

    return (np.random.default_rng(0).standard_normal(int(sampling_rate * seconds)) * 0.1).astype(np.float32)


def image_prompt(processor: Any, text: str, images: int = 1) -> str:
    """``text`` with ``images`` image placeholders, the way the processor expects them: through its chat template
    when it has one (a user turn holding the images, then the text; the generation prompt appended), else the
    processor's image token before the text (the processor expands each into the model's image tokens)."""
    template = getattr(processor, "chat_template", None)
    if template:
        content = [{"type": "image"} for _ in range(images)] + [{"type": "text", "text": text}]
        return processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                             tokenize=False)
    token = getattr(processor, "image_token", None)
    if token is None:
        raise UnsupportedError(
            f"{type(processor).__name__} has neither a chat template nor an image_token: cannot place the image in "
            "the prompt; save a processor with a chat template beside the export"
        )
    return token * images + text


def processor_parts(processor: Any) -> tuple[Any, Any, Any]:
    """``(tokenizer, image_processor, feature_extractor)`` of a processor (a tokenizer alone gives
    ``(tokenizer, None, None)``)."""
    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None and hasattr(processor, "decode"):
        tokenizer = processor
    return tokenizer, getattr(processor, "image_processor", None), getattr(processor, "feature_extractor", None)
