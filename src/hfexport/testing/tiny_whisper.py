"""A real-style Whisper generation config for the tiny Whisper of :mod:`.tiny_multimodal`.

The checkpoints on the Hub ship a ``generation_config.json`` that drives ``WhisperGenerationMixin.generate``: a
start-of-transcript token, language and task tokens (``lang_to_id``, ``task_to_id``, ``forced_decoder_ids`` with
the language left to detection), ``<|notimestamps|>`` and the timestamp tokens after it, suppressed and
begin-suppressed tokens, pad = EOS. This one lays the same special tokens out at the top of the tiny vocabulary
(the timestamp tokens are the last eight ids), so a tiny model generates through every branch of Whisper's own
generate without a download.
"""

from __future__ import annotations

from typing import Any

from .tiny_multimodal import EOS_ID, TEXT_ID_END, VOCAB

__all__ = ["WHISPER_SPECIAL", "whisper_generation_config"]

#: the tiny layout of Whisper's special tokens (real whisper-tiny: 50257 endoftext ... 50364 <|0.00|>)
WHISPER_SPECIAL = {
    "<|endoftext|>": EOS_ID,
    "<|startoftranscript|>": TEXT_ID_END - 8,
    "<|en|>": TEXT_ID_END - 7,
    "<|fr|>": TEXT_ID_END - 6,
    "<|de|>": TEXT_ID_END - 5,
    "<|translate|>": TEXT_ID_END - 4,
    "<|transcribe|>": TEXT_ID_END - 3,
    "<|startofprev|>": TEXT_ID_END - 2,
    "<|notimestamps|>": TEXT_ID_END - 1,
}
assert TEXT_ID_END + 8 == VOCAB  # the timestamp tokens <|0.00|> ... fill the vocabulary's end


def whisper_generation_config(multilingual: bool = True) -> Any:
    """The generation config a Whisper checkpoint ships, for the tiny vocabulary.

    Args:
        multilingual: Like whisper-tiny (language and task tokens; the language detected when not given), else
            like whisper-tiny.en (``forced_decoder_ids`` hold ``<|notimestamps|>`` only).
    """
    from transformers import GenerationConfig

    ids = WHISPER_SPECIAL
    fields: dict[str, Any] = dict(
        decoder_start_token_id=ids["<|startoftranscript|>"],
        bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID,
        no_timestamps_token_id=ids["<|notimestamps|>"],
        prev_sot_token_id=ids["<|startofprev|>"],
        max_initial_timestamp_index=1,
        return_timestamps=False,
        suppress_tokens=[5, 9, 17, 33, 65],
        begin_suppress_tokens=[4, EOS_ID],
        max_length=64,
        is_multilingual=multilingual,
    )
    if multilingual:
        fields.update(
            lang_to_id={k: ids[k] for k in ("<|en|>", "<|fr|>", "<|de|>")},
            task_to_id={"translate": ids["<|translate|>"], "transcribe": ids["<|transcribe|>"]},
            forced_decoder_ids=[[1, None], [2, ids["<|transcribe|>"]]],
        )
    else:
        fields.update(forced_decoder_ids=[[1, ids["<|notimestamps|>"]]])
    return GenerationConfig(**fields)
