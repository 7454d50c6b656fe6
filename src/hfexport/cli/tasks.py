"""Tasks for ``hfexport export --task``: the name a user types, the transformers auto class that loads a model for
it, and the task a model folder's own class implies (detected from ``config.json``, overridable).

The table reads transformers' own auto mappings (``MODEL_FOR_<TASK>_MAPPING_NAMES``: model type -> class name), so a
class transformers knows for a task is detected without a list of ours; the task names are the pipeline names users
know from the Hub.
"""

from __future__ import annotations

from typing import Any

__all__ = ["TASKS", "GENERATIVE_TASKS", "detect_task", "model_class_for"]

#: task -> (transformers auto class, its mapping in transformers.models.auto.modeling_auto); detection tries them in
#: this order (the generative tasks first: a class in two mappings is exported for generation)
TASKS: dict[str, tuple[str, str]] = {
    "image-text-to-text": ("AutoModelForImageTextToText", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES"),
    "automatic-speech-recognition": ("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
    "text2text-generation": ("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    "text-generation": ("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    "fill-mask": ("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),
    "text-classification": ("AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    "token-classification": ("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    "question-answering": ("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    "image-classification": ("AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    "feature-extraction": ("AutoModel", "MODEL_MAPPING_NAMES"),
}
GENERATIVE_TASKS = ("image-text-to-text", "automatic-speech-recognition", "text2text-generation", "text-generation")


def detect_task(config: Any) -> str:
    """The task of a model folder's class (``config.architectures[0]``); ``feature-extraction`` for a base model or
    a class no mapping lists."""
    import transformers.models.auto.modeling_auto as auto

    classes = set(getattr(config, "architectures", None) or [])
    for task, (_, mapping) in TASKS.items():
        names = getattr(auto, mapping, {})
        listed = {n for v in names.values() for n in ((v,) if isinstance(v, str) else v)}
        if classes & listed:
            return task
    return "feature-extraction"


def model_class_for(task: str, config: Any) -> Any:
    """The class that loads ``config``'s model for ``task``: its own architecture when that class serves the task,
    else the task's auto class (``AutoModelForCausalLM`` ...)."""
    import transformers

    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; known: {', '.join(TASKS)}")
    if detect_task(config) == task:
        for arch in getattr(config, "architectures", None) or []:
            cls = getattr(transformers, arch, None)
            if cls is not None:
                return cls
    return getattr(transformers, TASKS[task][0])
