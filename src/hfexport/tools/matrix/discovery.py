"""Which architectures the support matrix covers: one model class per ``model_type``, found in transformers' auto
mappings.

A ``model_type`` often has several classes (base model, causal LM head, classification heads...). The matrix takes
the one its most demanding task uses, in this order: speech seq2seq, text seq2seq, image-text-to-text, masked LM
(so encoders such as BERT are tested with their pre-training head, not their rarely used ``*LMHeadModel``), causal
LM, image classification, and the base model (feature extraction) last.

Example:
    >>> arch = {a.model_type: a for a in discover()}["llama"]
    >>> (arch.class_name, arch.task, arch.generative)
    ('LlamaForCausalLM', 'text-generation', True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

__all__ = ["Architecture", "TASKS", "discover", "GENERATIVE_TASKS"]

# (task, name of the mapping in transformers.models.auto.modeling_auto), in priority order
TASKS: tuple[tuple[str, str], ...] = (
    ("automatic-speech-recognition", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    ("text2text-generation", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ("image-text-to-text", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    ("fill-mask", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    ("text-generation", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    ("image-classification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ("feature-extraction", "MODEL_MAPPING_NAMES"),
)
GENERATIVE_TASKS = frozenset({"automatic-speech-recognition", "text2text-generation", "image-text-to-text",
                              "text-generation"})


@dataclass(frozen=True)
class Architecture:
    """One row of the matrix.

    Attributes:
        model_type: The config's ``model_type`` (``"llama"``).
        class_name: The transformers model class tested (``"LlamaForCausalLM"``).
        task: The task its auto mapping stands for (see :data:`TASKS`).
        generative: Whether the ``generate`` stage applies (``model.generate`` is meaningful for the task).
    """

    model_type: str
    class_name: str
    task: str
    generative: bool

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _mappings() -> list[tuple[str, dict[str, object]]]:
    from transformers.models.auto import modeling_auto

    return [(task, getattr(modeling_auto, name, {})) for task, name in TASKS]


def discover(families: list[str] | None = None) -> list[Architecture]:
    """Every ``model_type`` of transformers' auto mappings with the class the matrix tests, sorted by model_type.

    Args:
        families: Keep only model types containing one of these substrings (case-insensitive), or equal to one
            written ``=name``; all when empty.
    """
    chosen: dict[str, Architecture] = {}
    for task, mapping in _mappings():
        for model_type, names in mapping.items():
            if model_type in chosen:
                continue
            name = names if isinstance(names, str) else names[0]
            chosen[model_type] = Architecture(model_type, name, task, task in GENERATIVE_TASKS)
    wanted = [f.lower() for f in families or [] if f]

    def keep(model_type: str) -> bool:
        name = model_type.lower()
        return any(name == w[1:] if w.startswith("=") else w in name for w in wanted)

    return [chosen[k] for k in sorted(chosen) if not wanted or keep(k)]
