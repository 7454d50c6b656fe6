"""``ExportedModel.generate``: the decode loop over the exported components alone (no source model needed).

Each step's kwargs are rebuilt the way ``generate()`` built the ones the graphs were traced with: the next token,
the grown 2D mask (dynamic cache) or the 4D slot masks (static cache, one per attention kind), positions from the
mask, and the cache the previous step returned. The call's generation config, logits processors and stopping
criteria are transformers' own, built by ``GenerationMixin`` on a host holding the export's configs (:mod:`.plan`).

Modules, in the order a call goes through them: :mod:`.dispatch` (the loop for the export's kind), :mod:`.plan`
(the call's generation config, processors and criteria), :mod:`.decoder`, :mod:`.encoder_decoder`, :mod:`.beam`, :mod:`.multimodal`, over :mod:`.loop`
(a component's runner and cache, the text state, the step loop that picks tokens as ``GenerationMixin._sample``).
"""

from .dispatch import generate

__all__ = ["generate"]
