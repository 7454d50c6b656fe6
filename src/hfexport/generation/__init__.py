"""``ExportedModel.generate``: the decode loop over the exported components alone (no source model needed).

Each step's kwargs are rebuilt the way ``generate()`` built the ones the graphs were traced with: the next token,
the grown 2D mask (dynamic cache) or the 4D slot masks (static cache, one per attention kind), positions from the
mask, and the cache the previous step returned. Token selection reuses transformers' logits warpers.

Modules, in the order a call goes through them: :mod:`.dispatch` (the call's generation config, the loop for the
export's kind), :mod:`.decoder`, :mod:`.encoder_decoder`, :mod:`.beam`, :mod:`.multimodal`, over :mod:`.loop`
(token selection, a component's runner and cache, the text state, the step loop).
"""

from .dispatch import generate

__all__ = ["generate"]
