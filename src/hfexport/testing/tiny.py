"""Seeded, tiny, random-weight transformers models for tests.

Every case is built from a transformers config class only (no Hub access), with
hidden size around 64, two layers, a small vocabulary and few heads, so a forward
pass and a short greedy generation take milliseconds on a CPU. Builds are
deterministic: each ``build`` seeds torch with ``torch.manual_seed(0)`` inside a
forked RNG scope, so calling it twice gives identical weights and leaves the
caller's global RNG state untouched. Models are returned in ``eval()`` mode, in
float32, with ``attn_implementation="sdpa"`` where the class supports it.

Text cases share one token-id convention: ``pad=0``, ``bos=1``, ``eos=2``, and
sampled input ids are drawn from ``[3, 248)`` (ids 248-255 are reserved for
multimodal placeholders), so special tokens never appear by accident. Vision,
audio and image-text-to-text cases live in :mod:`hfexport.testing.tiny_multimodal`
and are merged into :data:`TINY_CASES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from transformers import (
    BertConfig,
    BertModel,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    PreTrainedModel,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    T5Config,
    T5ForConditionalGeneration,
)

from . import tiny_multimodal as _mm
from .tiny_multimodal import (
    BOS_ID,
    EOS_ID,
    FIRST_REGULAR_ID,
    PAD_ID,
    TEXT_ID_END,
    VOCAB,
    instantiate,
    make_generator,
    text_batch,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "FIRST_REGULAR_ID",
    "PAD_ID",
    "TINY_CASES",
    "VOCAB",
    "TinyCase",
    "t5_decoder_len",
    "tiny_inputs",
    "tiny_model",
]

HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 128
MAX_POSITIONS = 256
GEMMA3_SLIDING_WINDOW = 8

_SPECIAL_IDS = {"pad_token_id": PAD_ID, "bos_token_id": BOS_ID, "eos_token_id": EOS_ID}


@dataclass
class TinyCase:
    """One tiny test model and its input factory.

    Attributes:
        name: Registry key, e.g. ``"llama"``.
        family: One of ``"decoder-only"``, ``"encoder-only"``, ``"encoder-decoder"``,
            ``"ssm"``, ``"sliding-window"``, ``"moe"``, ``"vision"``, ``"audio"`` or
            ``"image-text-to-text"``.
        build: Zero-argument factory returning a freshly built, seeded, eval-mode
            fp32 model; two calls return models with identical weights.
        inputs: ``inputs(batch, seq, padded=True)`` returns forward kwargs, seeded by
            ``(batch, seq)``. Text inputs left-pad row 0 by two positions when
            ``padded`` is true and ``batch >= 2``.
        generative: Whether ``model.generate`` is meaningful for this case.
        auto_class: Name of the transformers auto class the model belongs to.
    """

    name: str
    family: str
    build: Callable[[], PreTrainedModel]
    inputs: Callable[..., dict[str, torch.Tensor]]
    generative: bool
    auto_class: str


def _causal_lm_inputs(batch: int, seq: int, padded: bool = True) -> dict[str, torch.Tensor]:
    """Return ``input_ids`` and ``attention_mask`` for a decoder-only text model.

    Args:
        batch: Batch size.
        seq: Sequence length.
        padded: Left-pad row 0 by two positions when ``batch >= 2``.

    Returns:
        A dict with ``input_ids`` and ``attention_mask``, both ``[batch, seq]`` int64.
    """
    input_ids, attention_mask = text_batch(make_generator(batch, seq), batch, seq, padded)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _bert_inputs(batch: int, seq: int, padded: bool = True) -> dict[str, torch.Tensor]:
    """Return BERT inputs: ids, mask and ``token_type_ids`` (segment 1 for the second half).

    Args:
        batch: Batch size.
        seq: Sequence length.
        padded: Left-pad row 0 by two positions when ``batch >= 2``.

    Returns:
        A dict with ``input_ids``, ``attention_mask`` and ``token_type_ids``.
    """
    inputs = _causal_lm_inputs(batch, seq, padded)
    token_type_ids = torch.zeros(batch, seq, dtype=torch.long)
    token_type_ids[:, seq // 2 :] = 1
    inputs["token_type_ids"] = token_type_ids
    return inputs


def t5_decoder_len(seq: int) -> int:
    """Return the decoder length the T5 case uses for an encoder length ``seq``."""
    return max(1, (seq + 1) // 2)


def _t5_inputs(batch: int, seq: int, padded: bool = True) -> dict[str, torch.Tensor]:
    """Return T5 inputs; ``decoder_input_ids`` starts with the decoder start token (pad).

    Args:
        batch: Batch size.
        seq: Encoder sequence length; the decoder length is :func:`t5_decoder_len`.
        padded: Left-pad encoder row 0 by two positions when ``batch >= 2``.

    Returns:
        A dict with ``input_ids``, ``attention_mask`` and ``decoder_input_ids``.
    """
    gen = make_generator(batch, seq)
    input_ids, attention_mask = text_batch(gen, batch, seq, padded)
    dec_len = t5_decoder_len(seq)
    decoder_input_ids = torch.randint(FIRST_REGULAR_ID, TEXT_ID_END, (batch, dec_len), generator=gen)
    decoder_input_ids[:, 0] = PAD_ID
    return {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": decoder_input_ids}


def _llama() -> PreTrainedModel:
    """Build the tiny ``LlamaForCausalLM``."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        **_SPECIAL_IDS,
    )
    return instantiate(LlamaForCausalLM, config)


def _qwen3() -> PreTrainedModel:
    """Build the tiny ``Qwen3ForCausalLM`` (q/k norm, explicit head_dim).

    Output embeddings are untied here (and for GPT-2 and Mamba): tied random
    embeddings make greedy decoding repeat the last prompt token forever. Gemma3
    keeps them tied (its embedding scaling avoids the collapse), so one case still
    exercises weight sharing.
    """
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=False,
        **_SPECIAL_IDS,
    )
    return instantiate(Qwen3ForCausalLM, config)


def _gpt2() -> PreTrainedModel:
    """Build the tiny ``GPT2LMHeadModel`` (learned absolute positions, Conv1D layers)."""
    config = GPT2Config(
        vocab_size=VOCAB,
        n_positions=MAX_POSITIONS,
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_inner=INTERMEDIATE,
        tie_word_embeddings=False,
        **_SPECIAL_IDS,
    )
    return instantiate(GPT2LMHeadModel, config)


def _gemma3() -> PreTrainedModel:
    """Build the tiny text-only ``Gemma3ForCausalLM`` with a sliding window of 8.

    Layer 0 uses sliding attention and layer 1 full attention, so a cache mixes
    both kinds and generating past ``2 * sliding_window`` tokens stays cheap.
    """
    config = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        query_pre_attn_scalar=HEAD_DIM,
        sliding_window=GEMMA3_SLIDING_WINDOW,
        layer_types=["sliding_attention", "full_attention"],
        max_position_embeddings=MAX_POSITIONS,
        **_SPECIAL_IDS,
    )
    return instantiate(Gemma3ForCausalLM, config)


def _mixtral() -> PreTrainedModel:
    """Build the tiny ``MixtralForCausalLM`` with 4 experts, top-2 routing."""
    config = MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=MAX_POSITIONS,
        **_SPECIAL_IDS,
    )
    return instantiate(MixtralForCausalLM, config)


def _qwen3_moe() -> PreTrainedModel:
    """Build the tiny ``Qwen3MoeForCausalLM`` with 4 experts, top-2, every layer sparse."""
    config = Qwen3MoeConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        moe_intermediate_size=32,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        decoder_sparse_step=1,
        max_position_embeddings=MAX_POSITIONS,
        **_SPECIAL_IDS,
    )
    return instantiate(Qwen3MoeForCausalLM, config)


def _bert() -> PreTrainedModel:
    """Build the tiny ``BertModel`` (with pooler)."""
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        intermediate_size=INTERMEDIATE,
        max_position_embeddings=MAX_POSITIONS,
        type_vocab_size=2,
        **_SPECIAL_IDS,
    )
    return instantiate(BertModel, config, generation=False)


def _t5() -> PreTrainedModel:
    """Build the tiny ``T5ForConditionalGeneration`` (decoder start token = pad, T5 convention).

    ``initializer_factor=3.0`` keeps greedy decoding from collapsing onto the start
    token, which the default factor does at this size.
    """
    config = T5Config(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        d_kv=HEAD_DIM,
        d_ff=INTERMEDIATE,
        num_layers=LAYERS,
        num_decoder_layers=LAYERS,
        num_heads=HEADS,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        initializer_factor=3.0,
        decoder_start_token_id=PAD_ID,
        **_SPECIAL_IDS,
    )
    return instantiate(T5ForConditionalGeneration, config, decoder_start_token_id=PAD_ID)


def _mamba() -> PreTrainedModel:
    """Build the tiny ``MambaForCausalLM`` (pure-torch slow path on CPU)."""
    config = MambaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        state_size=8,
        num_hidden_layers=LAYERS,
        expand=2,
        conv_kernel=4,
        tie_word_embeddings=False,
        **_SPECIAL_IDS,
    )
    return instantiate(MambaForCausalLM, config)


def _text_case(name: str, family: str, build: Callable[[], PreTrainedModel]) -> TinyCase:
    """Return a generative decoder-only text case using the shared causal-LM inputs."""
    return TinyCase(name, family, build, _causal_lm_inputs, True, "AutoModelForCausalLM")


TINY_CASES: dict[str, TinyCase] = {
    case.name: case
    for case in (
        _text_case("llama", "decoder-only", _llama),
        _text_case("qwen3", "decoder-only", _qwen3),
        _text_case("gpt2", "decoder-only", _gpt2),
        _text_case("gemma3", "sliding-window", _gemma3),
        _text_case("mixtral", "moe", _mixtral),
        _text_case("qwen3_moe", "moe", _qwen3_moe),
        _text_case("mamba", "ssm", _mamba),
        TinyCase("bert", "encoder-only", _bert, _bert_inputs, False, "AutoModel"),
        TinyCase("t5", "encoder-decoder", _t5, _t5_inputs, True, "AutoModelForSeq2SeqLM"),
        *(TinyCase(**spec) for spec in _mm.MULTIMODAL_SPECS),
    )
}


def tiny_model(name: str) -> PreTrainedModel:
    """Build the tiny model registered under ``name``.

    Args:
        name: A key of :data:`TINY_CASES`.

    Returns:
        A freshly built, seeded, eval-mode float32 model.

    Raises:
        KeyError: If ``name`` is not a known case.
    """
    return _case(name).build()


def tiny_inputs(name: str, batch: int = 2, seq: int = 7, padded: bool = True) -> dict[str, torch.Tensor]:
    """Return seeded forward kwargs for the case registered under ``name``.

    Args:
        name: A key of :data:`TINY_CASES`.
        batch: Batch size.
        seq: Text sequence length (ignored by pure vision cases).
        padded: Left-pad row 0 of text inputs by two positions when ``batch >= 2``.

    Returns:
        A dict of tensors to pass as ``model(**inputs)``.

    Raises:
        KeyError: If ``name`` is not a known case.
    """
    return _case(name).inputs(batch, seq, padded=padded)


def _case(name: str) -> TinyCase:
    """Look up a case, raising a ``KeyError`` that lists the known names."""
    try:
        return TINY_CASES[name]
    except KeyError:
        raise KeyError(f"unknown tiny case {name!r}; known: {sorted(TINY_CASES)}") from None
