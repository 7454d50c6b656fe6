"""Shared pieces of the backend contract tests (tests/test_<format>_backend.py): the tiny Llama they all export, its
greedy static-cache generation config, and module-scoped fixtures of the model and of its plain dynamic export.

A test module imports the fixtures it uses (pytest picks up fixtures from the module's names; module scope: one per
test module)::

    from backend_fixtures import CASE, model, plain_fixture, static_config  # noqa: F401 (fixtures)
    plain = plain_fixture(OnnxExporter, OnnxConfig(dynamic=True))
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from hfexport.testing.tiny import TINY_CASES

CASE = TINY_CASES["llama"]
CACHE_LEN = 48


def static_config(model: Any, max_cache_len: int = CACHE_LEN) -> Any:
    """``model``'s generation config, greedy, with a static cache of ``max_cache_len`` positions."""
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample, gen.cache_implementation, gen.max_cache_len = False, "static", max_cache_len
    return gen


@pytest.fixture(scope="module")
def model():
    """The tiny Llama (``TINY_CASES["llama"]``), built once per test module."""
    return CASE.build()


def plain_fixture(exporter: type, config: Any) -> Any:
    """A module-scoped ``plain`` fixture: ``model`` exported by ``exporter().export`` with ``config`` from a batch of
    2 x 7 tokens."""

    @pytest.fixture(scope="module")
    def plain(model):
        return exporter().export(model, CASE.inputs(2, 7), config)

    return plain
