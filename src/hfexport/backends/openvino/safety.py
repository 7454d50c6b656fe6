"""Checks on a saved OpenVINO IR (``.xml`` + ``.bin``) before ``Core.read_model`` opens it.

What ``Core().read_model(xml)`` reads and runs (openvino 2026.3):

- **The frontend is picked by content, not by name.** Each installed frontend (IR, ONNX, TensorFlow, TFLite,
  Paddle) is asked whether it supports the file; an ONNX protobuf named ``openvino_model.xml`` is read as ONNX, with
  the ONNX frontend's own external-data rules.
- **The IR XML** is parsed with pugixml (no DTD processing: entities are not expanded, nothing is fetched). Each
  ``<layer>`` is created from the opset its ``version`` names (``opset1``..``opsetN``), or from an extension the
  *caller* added (``core.add_extension``, or a package such as ``openvino_tokenizers`` patching ``Core``); an op in
  no such set fails with "from unsupported opset".
- **The weights** are ``<xml stem>.bin`` beside it (the frontend swaps the extension; the XML cannot name another
  file). ``Const`` layers, and a legacy ``<pre-process>`` block, take ``offset``/``size`` ranges of it.
- **Compile options.** ``rt_info/runtime_options`` in the XML (e.g. ``KV_CACHE_PRECISION``) are applied by the CPU
  plugin at ``compile_model``, over what the runner asked for.

hfexport writes an IR ``<net>`` of standard-opset layers with ``<layers>``, ``<edges>`` and ``<rt_info>``, and its
``.bin``, both listed in ``export.json``. :func:`check_ir` refuses anything else and returns the ``.bin`` to pass
to ``read_model`` explicitly.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from xml.parsers import expat

from ...manifest import listed_files, reference_problem
from ...manifest_schema import fail

__all__ = ["IR_VERSIONS", "known_opsets", "check_ir"]

IR_VERSIONS = frozenset({"10", "11"})
"""The ``<net version=...>`` values the IR frontend reads."""

_NET_CHILDREN = frozenset({"layers", "edges", "rt_info"})
_CONST_TYPES = frozenset({"const", "constant"})
_ADVICE = "re-export the model, or get the export from a trusted source"
_CHUNK = 1 << 20


def known_opsets() -> frozenset[str]:
    """The opsets this OpenVINO creates layers from without extensions (``opset1`` .. ``opsetN``)."""
    import openvino as ov

    return frozenset(name for name in dir(ov) if re.fullmatch(r"opset\d+", name))


def check_ir(xml_path: Path) -> Path:
    """Check the IR at ``xml_path`` and its weights; return the ``.bin`` to read with it.

    Raises:
        ManifestError: listing every problem, each naming the file and the element or layer.
    """
    folder = xml_path.parent
    weights = xml_path.with_suffix(".bin")
    problems: list[str] = []
    listed = listed_files(folder)
    bin_problem = reference_problem(folder, weights.name, listed)
    if bin_problem:
        problems.append(f"{xml_path.name}: its weights {bin_problem}; {_ADVICE}")
    bin_size = None if bin_problem else os.stat(weights).st_size
    scan = _IRScan(known_opsets(), bin_size, weights.name)
    problems += [f"{xml_path.name}: {p}; {_ADVICE}" for p in scan.run(xml_path)]
    if problems:
        fail(str(xml_path), problems)  # ManifestError, the list capped
    return weights


class _IRScan:
    """One streaming pass over the XML (expat: the file is never held whole), collecting problems."""

    def __init__(self, opsets: frozenset[str], bin_size: int | None, bin_name: str):
        self.opsets = opsets
        self.bin_size = bin_size
        self.bin_name = bin_name
        self.problems: list[str] = []
        self.stack: list[str] = []
        self.layers: list[tuple[str, str]] = []  # (label, type) of each open <layer>
        self.layers_seen = False

    def run(self, xml_path: Path) -> list[str]:
        parser = expat.ParserCreate()
        # a DTD could declare entities (pugixml, OpenVINO's parser, ignores them; nothing downstream should see one)
        parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        parser.StartDoctypeDeclHandler = lambda *_: self._refuse("has a DOCTYPE (a DTD)")
        parser.EntityDeclHandler = lambda *_: self._refuse("declares an XML entity")
        parser.ExternalEntityRefHandler = lambda *_: self._refuse("references an external entity")
        parser.ProcessingInstructionHandler = lambda *_: self._refuse("has an XML processing instruction")
        parser.StartElementHandler = self._start
        parser.EndElementHandler = self._end
        try:
            with open(xml_path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    parser.Parse(chunk, False)
                parser.Parse(b"", True)
        except expat.ExpatError as e:
            return self.problems + [f"is not well-formed XML ({expat.errors.messages[e.code]} at line {e.lineno}, "
                                    f"column {e.offset}): truncated or corrupt"]
        except _Refused:
            return self.problems
        if not self.problems and not self.layers_seen:
            self.problems.append("has no <layers>: not an OpenVINO IR")
        return self.problems

    def _refuse(self, what: str) -> None:
        self.problems.append(f"{what}; OpenVINO IR never needs one")
        raise _Refused

    def _start(self, name: str, attrs: dict[str, str]) -> None:
        if ":" in name or any(":" in key or key == "xmlns" for key in attrs):
            self._refuse(f"has the namespaced element or attribute <{name}> (XInclude and friends)")
        depth = len(self.stack)
        if depth == 0:
            self._check_net(name, attrs)
        elif depth == 1 and name not in _NET_CHILDREN:
            self.problems.append(f"has a <{name}> block in <net> (hfexport writes only {sorted(_NET_CHILDREN)})")
        elif depth == 1 and name == "layers":
            self.layers_seen = True
        elif self.stack[-2:] == ["net", "rt_info"] and name == "runtime_options":
            self.problems.append("carries compile options in <rt_info><runtime_options> (applied by compile_model "
                                 "over the runner's own)")
        if name == "layer":
            self._check_layer(attrs)
        elif name == "data" and self.stack[-1:] == ["layer"] and self.layers[-1][1].lower() in _CONST_TYPES:
            self._check_const(self.layers[-1][0], attrs)
        self.stack.append(name)

    def _end(self, name: str) -> None:
        self.stack.pop()
        if name == "layer":
            self.layers.pop()

    def _check_net(self, name: str, attrs: dict[str, str]) -> None:
        if name != "net":
            self._refuse(f"has the root element <{name}>, not <net>: not an OpenVINO IR")
        if attrs.get("version") not in IR_VERSIONS:
            self.problems.append(f"is IR version {attrs.get('version')!r}; OpenVINO reads {sorted(IR_VERSIONS)}")

    def _check_layer(self, attrs: dict[str, str]) -> None:
        label = f"layer {attrs.get('name', '?')!r} (id {attrs.get('id', '?')}, type {attrs.get('type', '?')})"
        self.layers.append((label, attrs.get("type", "")))
        version = attrs.get("version", "")
        if version not in self.opsets:
            # another opset is served only by an extension: a library the caller added, never the model
            newest = max(int(name[5:]) for name in self.opsets)
            self.problems.append(f"{label} is from opset {version!r}, not one of OpenVINO's opset1..opset{newest} "
                                 "(it would need an extension)")
        # the type within a built-in opset is left to OpenVINO's reader (it refuses an unknown one, and knows the IR's
        # legacy spellings such as SoftMax that a lookup here would not): its error is then reported as this file's

    def _check_const(self, label: str, attrs: dict[str, str]) -> None:
        if attrs.get("element_type") == "string":
            # string constants are unpacked from offsets stored inside the .bin; hfexport never writes them
            self.problems.append(f"{label} is a string constant")
            return
        try:
            offset, size = int(attrs.get("offset", "0")), int(attrs.get("size", "0"))
        except ValueError:
            self.problems.append(f"{label} has a non-integer offset or size")
            return
        if offset < 0 or size < 0:
            self.problems.append(f"{label} has a negative offset or size ({offset}, {size})")
        elif self.bin_size is not None and offset + size > self.bin_size:
            self.problems.append(f"{label} reads bytes {offset}..{offset + size} of {self.bin_name!r}, which has "
                                 f"{self.bin_size}: truncated or corrupt")


class _Refused(Exception):
    """Stops the scan at a construct after which nothing else in the file matters."""
