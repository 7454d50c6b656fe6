"""The one tree walker: transformers' caches as pytree nodes, dotted leaf names, and the tensor leaves of any input
or output structure (the bottom layer: imports nothing of ours).

Everything walks with ``torch.utils._pytree``, so a leaf has one name everywhere: in the metadata an export saves,
in :func:`get_leaf_tensors`'s keys and in a validation report (``input_ids``, ``logits``,
``past_key_values.layers.0.keys``), and :func:`tensor_leaves` gives the tensors in that same order, the order of an
exported program's inputs.

A cache flattens to its tensors, each under a readable key path (``layers[0].keys``, ``layers[1].conv_states[0]``),
and a context that is plain JSON: the class path and every non-tensor attribute. Contexts are JSON so that the
tree specs serialise with ``treespec_dumps`` and reload with no pickle, and unflattening rebuilds the exact class
without the model config. Only classes from ``transformers`` (and this package) are ever rebuilt from a context.
"""

from __future__ import annotations

from . import caches, names
from .caches import *  # noqa: F403  (the package's names: each module's __all__)
from .names import *  # noqa: F403

__all__ = [*caches.__all__, *names.__all__]
