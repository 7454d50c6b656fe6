"""Gated delta rule: the chunk's triangular system inverted in log2(chunk) block steps, not a Python loop over rows.

The torch fallbacks of the chunked (gated) delta rule, ``torch_chunk_gated_delta_rule`` (Qwen3-Next, Qwen3.5 and
its MoE, OLMo-Hybrid, Qwen4-Exp) and ``chunk_kimi_delta_attention`` (Kimi-Linear, Bailing-Hybrid, GLM-5-Next),
invert each chunk's unit lower-triangular system by forward substitution while exporting (``for i in range(1,
chunk_size)``: one row at a time, two clones, a product, a sum and an in-place write per row; eager Qwen3.5 calls
``torch.linalg.solve_triangular``, which no export backend translates). ``torch.export`` unrolls the loop: 63 rows x
every linear-attention layer, each write functionalized into a scatter (the traced Qwen3.5 more than twice the nodes).
The support matrix's tiny Qwen3.5 text model, ExecuTorch generation export (2026-12-07, alone on 2 cores): 342 s
without this, 235 s with it (its prefill program's lowering 243 -> 115 s), eager's tokens both ways.

While a model of these families is traced, the function is taken from transformers' own source with that loop, and
only it, replaced by :func:`strictly_lower_inverse`: the same inverse by recursive 2 x 2 blocks (``inv([[A, 0],
[C, D]]) = [[inv A, 0], [-inv D C inv A, inv D]]``), six batched steps for a chunk of 64, stable as the substitution
(a power series of the nilpotent part, the other closed form, loses everything to cancellation where keys are
alike). The rest of the function is transformers' unchanged. Where the loop's text is not found (another transformers)
the workaround does not apply. Drop it once transformers' export path inverts the chunk without a Python loop.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import textwrap
import types
from typing import Any

import torch

from ..registry import patch_attribute, undo_all, workaround

__all__ = ["strictly_lower_inverse", "FUNCTIONS", "rewritten"]

#: modeling module (under transformers.models) -> the torch fallback whose loop is replaced
FUNCTIONS = {
    "qwen3_next": "torch_chunk_gated_delta_rule",
    "qwen3_5": "torch_chunk_gated_delta_rule",
    "qwen3_5_moe": "torch_chunk_gated_delta_rule",
    "olmo_hybrid": "torch_chunk_gated_delta_rule",
    "qwen4_exp": "torch_chunk_gated_delta_rule",
    "kimi_linear": "chunk_kimi_delta_attention",
    "bailing_hybrid": "chunk_kimi_delta_attention",
    "glm5_next": "chunk_kimi_delta_attention",
}

# the forward substitution, as transformers writes it (its matrix named ut_system or attn)
_LOOP = re.compile(
    r"^(?P<indent>[ \t]*)for i in range\(1, chunk_size\):\n"
    r"(?P=indent)[ \t]+row = (?P<m>\w+)\[\.\.\., i, :i\]\.clone\(\)\n"
    r"(?P=indent)[ \t]+sub = (?P=m)\[\.\.\., :i, :i\]\.clone\(\)\n"
    r"(?P=indent)[ \t]+(?P=m)\[\.\.\., i, :i\] = row \+ \(row\.unsqueeze\(-1\) \* sub\)\.sum\(-2\)\n",
    re.MULTILINE,
)
# (imported where it is called: the function keeps its module's globals, which do not name it)
_CALL = f'__import__("{__name__}", fromlist=["_"]).strictly_lower_inverse'


def strictly_lower_inverse(x: torch.Tensor) -> torch.Tensor:
    """``(I - x)^-1 - I`` of a strictly lower-triangular ``x`` ``[..., n, n]``: what transformers' loop leaves in
    ``x`` (it adds the identity after). ``n`` a power of two: recursive 2 x 2 blocks, built with products, sums and
    concatenations only (every backend lowers them); otherwise the rows one by one, as transformers does."""
    n = x.shape[-1]
    if n & (n - 1):
        out = x.clone()
        for i in range(1, n):
            row = out[..., i, :i].clone()
            out[..., i, :i] = row + (row.unsqueeze(-1) * out[..., :i, :i]).sum(-2)
        return out
    lower = -x  # the inverse of I + lower, block by block; its diagonal blocks start as 1 x 1 ones
    inverse = torch.ones(*x.shape[:-2], n, 1, 1, dtype=x.dtype, device=x.device)
    size = 1
    while size < n:
        pairs = n // (2 * size)
        # each pair's coupling block: rows of its second half, columns of its first
        grid = lower.unflatten(-2, (pairs, 2, size)).unflatten(-1, (pairs, 2, size))  # [..., p, 2, s, p, 2, s]
        coupling = grid[..., :, 1, :, :, 0, :]  # [..., p, s, q, s]
        same = torch.eye(pairs, dtype=x.dtype, device=x.device).unsqueeze(-1).unsqueeze(-3)  # [p, 1, q, 1]
        coupling = (coupling * same).sum(-2)  # [..., p, s, s]: each pair's own block (q = p)
        first, second = inverse[..., 0::2, :, :], inverse[..., 1::2, :, :]
        corner = -(second @ coupling @ first)
        top = torch.cat([first, torch.zeros_like(first)], -1)
        inverse = torch.cat([top, torch.cat([corner, second], -1)], -2)
        size *= 2
    return inverse[..., 0, :, :] - torch.eye(n, dtype=x.dtype, device=x.device)


def rewritten(family: str) -> Any:
    """The family's torch fallback compiled again from transformers' source with the loop replaced by a call of
    :func:`strictly_lower_inverse`, with its module's own globals (live: a name another workaround patches there is
    the patched one) and defaults; ``None`` where its module is not imported or the source is not as expected."""
    module = sys.modules.get(f"transformers.models.{family}.modeling_{family}")
    wrapped = getattr(module, FUNCTIONS[family], None) if module is not None else None
    return None if wrapped is None else _recompiled(inspect.unwrap(wrapped))  # (under the hub-kernel wrapper)


@functools.lru_cache(maxsize=None)
def _recompiled(original: Any) -> Any:
    """:func:`rewritten` of one function, once per process (a module not yet imported is not cached as ``None``)."""
    try:
        source = textwrap.dedent(inspect.getsource(original))
    except (OSError, TypeError):
        return None
    source = source[source.index("def "):]  # (its decorators stay on the wrapper, not on this function)
    source, count = _LOOP.subn(lambda m: f"{m['indent']}{m['m']} = {_CALL}({m['m']})\n", source)
    if count != 1:
        return None
    code = compile(source, inspect.getsourcefile(original) or "<transformers>", "exec")
    body = next(c for c in code.co_consts if isinstance(c, types.CodeType) and c.co_name == original.__name__)
    function = types.FunctionType(body, vars(sys.modules[original.__module__]), original.__name__,
                                  original.__defaults__)
    function.__kwdefaults__ = original.__kwdefaults__
    return function


def _families(model: Any) -> list[str]:
    used = {type(m).__module__ for m in model.modules()} if hasattr(model, "modules") else set()
    return [f for f in FUNCTIONS if f"transformers.models.{f}.modeling_{f}" in used and rewritten(f) is not None]


@workaround(
    id="delta-rule-block-inverse",
    backend="all",
    target="transformers.models.{qwen3_next,qwen3_5,qwen3_5_moe,olmo_hybrid,qwen4_exp}.torch_chunk_gated_delta_rule, "
    "{kimi_linear,bailing_hybrid,glm5_next}.chunk_kimi_delta_attention (the export path's forward substitution)",
    breaks="nothing wrong, only slow: the unrolled row loop is 63 in-place writes per linear-attention layer; "
    "the tiny Qwen3.5's ExecuTorch generation export 342 s (235 s without the loop)",
    upstream=None,
    versions={"transformers": ">=5.0,<5.24"},
    applies=lambda model, inputs: bool(_families(model)),
)
def _apply(model: Any, inputs: dict):
    return undo_all([patch_attribute(sys.modules[f"transformers.models.{f}.modeling_{f}"], FUNCTIONS[f], rewritten(f))
                     for f in _families(model)])
