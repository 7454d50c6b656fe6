"""Load a model folder (or Hub id) the way the CLI needs it, and build sample inputs for it."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["load_model_and_processor", "sample_inputs"]

_PROMPTS = ["The quick brown fox jumps over the lazy dog.", "Hello, world!"]


def _model_class(config: Any) -> Any:
    import transformers

    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            return cls
    return transformers.AutoModel


def load_model_and_processor(model_id: str) -> tuple[torch.nn.Module, Any]:
    """The model (fp32, eval, sdpa attention where supported) and its tokenizer/processor if it has one."""
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    config = AutoConfig.from_pretrained(model_id)
    cls = _model_class(config)
    try:
        model = cls.from_pretrained(model_id, attn_implementation="sdpa", dtype=torch.float32)
    except (ValueError, ImportError):
        model = cls.from_pretrained(model_id, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    processor = None
    for loader in (AutoTokenizer, AutoProcessor):
        try:
            processor = loader.from_pretrained(model_id)
            break
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return model, processor


def sample_inputs(model: torch.nn.Module, processor: Any) -> dict[str, Any]:
    """Small, representative forward kwargs: two padded prompts for text models, a random image for vision ones."""
    config = model.config
    main_input = getattr(model, "main_input_name", "input_ids")
    if main_input == "input_ids":
        if processor is not None and callable(processor):
            if getattr(processor, "pad_token", "x") is None:
                processor.pad_token = processor.eos_token
            encoded = processor(_PROMPTS, padding=True, return_tensors="pt")
            return {k: v for k, v in encoded.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        vocab = getattr(config, "vocab_size", 100)
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (2, 8), generator=generator)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if main_input == "pixel_values":
        size = getattr(config, "image_size", 224)
        channels = getattr(config, "num_channels", 3)
        return {"pixel_values": torch.randn(1, channels, size, size, generator=torch.Generator().manual_seed(0))}
    raise ValueError(f"no sample inputs for a model whose main input is {main_input!r}; export it from Python")
