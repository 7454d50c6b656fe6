"""Property: whatever ``export.json`` holds, the manifest reader raises nothing but ``ManifestError``.

Manifests are generated two ways: arbitrary JSON, and a real manifest of a tiny export with parts replaced by
arbitrary JSON or by near-miss values (strings for ints, lists for objects, paths with ``..``, deep nesting), so that
the reader's later checks (files on disk, sizes, hashes, components, configs, metadata) are reached too.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hfexport import ManifestError
from hfexport.exported import _metadata
from hfexport.manifest import read_manifest

EXAMPLES = 2_000

_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20)
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=4), max_leaves=20)
_near_miss = st.sampled_from([
    "1", "", None, True, -1, 2**64, [], {}, [[]], "../x", "/etc/passwd", "a\\b", "a\x00b", ".hfexport-staging/x",
    "model.pt2", "config.json", "0" * 64, "Z" * 64, [{"path": "config.json"}], {"files": []}, "x/" * 300,
]) | _json


def _paths(value):
    """Every (key path) in a JSON value, for picking a place to replace."""
    out = [()]
    if isinstance(value, dict):
        for key, child in value.items():
            out += [(key, *rest) for rest in _paths(child)]
    elif isinstance(value, list):
        for index, child in enumerate(value):
            out += [(index, *rest) for rest in _paths(child)]
    return out


def _replace(value, path, new):
    if not path:
        return new
    value = copy.copy(value)
    value[path[0]] = _replace(value[path[0]], path[1:], new)
    return value


@st.composite
def _mutated(draw, base):
    body = base
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(body)
        path = draw(st.sampled_from(paths))
        body = _replace(body, path, draw(_near_miss))
    return body


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_export):
    directory = tmp_path_factory.mktemp("fuzz") / "export"
    tiny_export.exported.save_pretrained(directory)
    return directory


def _read(folder: Path, body) -> None:
    try:
        text = json.dumps(body, allow_nan=True)
    except (ValueError, RecursionError):
        return
    (folder / "export.json").write_text(text)
    try:
        manifest, root = read_manifest(folder, verify=True)
        for name, component in manifest["components"].items():
            _metadata(root, name, component["metadata"])
    except ManifestError:
        pass


def test_the_fuzzed_manifests_reach_the_later_checks(folder):
    """The mutation strategy starts from a manifest that reads: so a mutated one fails on the part it changed."""
    read_manifest(folder)


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
@given(data=st.data())
def test_any_manifest_gives_a_manifest_error_or_loads(folder, data):
    base = json.loads((folder / "export.json.orig").read_text()) if (folder / "export.json.orig").exists() else None
    if base is None:
        base = json.loads((folder / "export.json").read_text())
        (folder / "export.json.orig").write_text(json.dumps(base))
    body = data.draw(_json | _mutated(base) | _mutated(base))
    _read(folder, body)
