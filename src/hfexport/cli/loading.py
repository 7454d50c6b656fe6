"""Load a model folder (or Hub id) the way the CLI needs it, and build sample inputs for it."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["load_model_and_processor", "sample_inputs"]

_PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world!"]


def load_model_and_processor(
    model_id: str, task: str | None = None, dtype: torch.dtype = torch.float32, device: str = "cpu"
) -> tuple[torch.nn.Module, Any]:
    """The model (eval, sdpa attention where supported) for ``task`` (detected from its class when None), in
    ``dtype`` on ``device``, and its tokenizer/processor if it has one."""
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    from .tasks import detect_task, model_class_for

    config = AutoConfig.from_pretrained(model_id)
    cls = model_class_for(task or detect_task(config), config)
    try:
        model = cls.from_pretrained(model_id, attn_implementation="sdpa", dtype=dtype)
    except (ValueError, ImportError):
        model = cls.from_pretrained(model_id, attn_implementation="eager", dtype=dtype)
    model.to(device).eval()
    processor = None
    # the processor first (image / audio models: it holds the tokenizer too); a text model's is its tokenizer
    for loader in (AutoProcessor, AutoTokenizer):
        try:
            processor = loader.from_pretrained(model_id)
        except (OSError, ValueError, KeyError, TypeError, ImportError, AttributeError):
            continue
        if loader is AutoTokenizer or callable(processor):
            break
    return model, processor


def sample_inputs(model: torch.nn.Module, processor: Any) -> dict[str, Any]:
    """Small, representative forward (or generate) kwargs on the model's device: two prompts (left-padded for a
    decoder that generates) for text models, the same two with a synthetic image each through the processor for
    image-text-to-text ones, a random image for vision ones, a second of audio features for speech ones."""
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    inputs = _sample_inputs(model, processor)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}


def _image_text_inputs(processor: Any) -> dict[str, Any]:
    """Two prompts of different lengths, one synthetic image each, left-padded: what the image-text-to-text
    export is traced and validated with."""
    from .media import image_prompt, synthetic_image

    tokenizer = processor.tokenizer
    if getattr(tokenizer, "pad_token", "x") is None:
        tokenizer.pad_token = tokenizer.eos_token
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        texts = [image_prompt(processor, prompt) for prompt in _PROMPTS]
        return dict(processor(text=texts, images=[synthetic_image(processor, i) for i in range(len(texts))],
                              padding=True, return_tensors="pt"))
    finally:
        tokenizer.padding_side = side


def _sample_inputs(model: torch.nn.Module, processor: Any) -> dict[str, Any]:
    from ..capture.multimodal import is_multimodal

    config = model.config
    main_input = getattr(model, "main_input_name", "input_ids")
    if is_multimodal(model):
        if processor is None or not hasattr(processor, "image_processor") or not hasattr(processor, "tokenizer"):
            raise ValueError(
                f"{type(model).__name__} takes images, and its folder has no processor (tokenizer + image "
                "processor) to build sample inputs with; save AutoProcessor.from_pretrained(MODEL) in it, or "
                "export it from Python with your own inputs"
            )
        return _image_text_inputs(processor)
    if main_input == "input_ids":
        if processor is not None and callable(processor):
            if getattr(processor, "pad_token", "x") is None:
                processor.pad_token = processor.eos_token
            decoder_generates = model.can_generate() and not getattr(config, "is_encoder_decoder", False)
            side = getattr(processor, "padding_side", None)
            if decoder_generates and side is not None:
                processor.padding_side = "left"
            try:
                encoded = processor(_PROMPTS, padding=True, return_tensors="pt")
            finally:
                if side is not None:
                    processor.padding_side = side
            return {k: v for k, v in encoded.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        vocab = getattr(config, "vocab_size", 100)
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (2, 8), generator=generator)
        mask = torch.ones_like(ids)
        if model.can_generate() and not getattr(config, "is_encoder_decoder", False):
            mask[1, :3] = 0  # a left-padded row: the export keeps the mask, and generates padded batches
        return {"input_ids": ids, "attention_mask": mask}
    if main_input == "input_features":
        from .media import synthetic_audio

        extractor = getattr(processor, "feature_extractor", processor)
        rate = getattr(extractor, "sampling_rate", 16000)
        audio = synthetic_audio(rate)
        if extractor is not None and callable(extractor):
            return {"input_features": extractor(audio, sampling_rate=rate, return_tensors="pt").input_features}
        bins = getattr(config, "num_mel_bins", 80)
        return {"input_features": torch.randn(1, bins, 3000, generator=torch.Generator().manual_seed(0))}
    if main_input == "pixel_values":
        size = getattr(config, "image_size", 224)
        channels = getattr(config, "num_channels", 3)
        return {"pixel_values": torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(0))}
    raise ValueError(f"no sample inputs for a model whose main input is {main_input!r}; export it from Python")
