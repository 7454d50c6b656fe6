"""ONNX, OpenVINO and ExecuTorch programs an attacker rewrote (and resealed): refused before the runtime reads them.

``FORMAT_CASES`` is merged into the main table of ``tests/test_security.py``, which runs the rows; the tests here check
that honest exports of each format still load, and what needs a child process (a runtime that aborts). What each
format can read or run, and what is checked: docs/security.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from hfexport import ExportedModel, ManifestError
from security_support import (  # noqa: F401
    CASE, Case, add_file, copy_export, inputs, manifest, program_file, reseal, saved_exports, tiny_model,
    write_manifest,
)

ATOL = 1e-4


def _unlist(name: str) -> Callable[[Path, Path], None]:
    """Drop ``name`` from the manifest (files and components): the manifest then never checks it."""

    def tamper(folder: Path, marker: Path) -> None:
        body = manifest(folder)
        body["files"] = [e for e in body["files"] if e["path"] != name]
        for component in body["components"].values():
            component["files"] = [f for f in component["files"] if f != name]
        write_manifest(folder, body)

    return tamper


def _outside(folder: Path, marker: Path, data: bytes) -> Path:
    """A file beside the export folder (where a payload would read from), holding ``data``."""
    target = marker.parent / "outside.bin"
    target.write_bytes(data)
    return target


# --- ONNX ----------------------------------------------------------------------------------------------------------


def _onnx(edit: Callable) -> Callable[[Path, Path], None]:
    """Rewrite the graph protobuf (its weights untouched): ``edit(model, folder, marker)``."""

    def tamper(folder: Path, marker: Path) -> None:
        import onnx

        path = program_file(folder)
        model = onnx.load(str(path), load_external_data=False)
        edit(model, folder, marker)
        onnx.save(model, str(path))

    return tamper


def _first_external(model):
    return next(t for t in model.graph.initializer if t.data_location == 1)


def _set_external(tensor, **entries) -> None:
    for entry in tensor.external_data:
        if entry.key in entries:
            entry.value = str(entries.pop(entry.key))
    for key, value in entries.items():
        tensor.external_data.add(key=key, value=str(value))


def _external_tensor(location: str, name: str = "evil"):
    import onnx

    tensor = onnx.TensorProto(name=name, data_type=onnx.TensorProto.FLOAT, dims=[4])
    tensor.data_location = onnx.TensorProto.EXTERNAL
    _set_external(tensor, location=location, offset=0, length=16)
    return tensor


def _constant_node(location: str):
    import onnx

    return onnx.helper.make_node("Constant", [], ["evil_out"], name="evil_constant", value=_external_tensor(location))


def _abs_location(model, folder, marker):
    data = (folder / "model.onnx.data").read_bytes()
    _set_external(_first_external(model), location=str(_outside(folder, marker, data)))


def _dotdot_location(model, folder, marker):
    _outside(folder, marker, (folder / "model.onnx.data").read_bytes())
    _set_external(_first_external(model), location="../outside.bin")


def _unlisted_copy(model, folder, marker):
    (folder / "copy.onnx.data").write_bytes((folder / "model.onnx.data").read_bytes())
    _set_external(_first_external(model), location="copy.onnx.data")


def _link_out(listed: bool):
    def edit(model, folder, marker):
        target = _outside(folder, marker, (folder / "model.onnx.data").read_bytes())
        os.symlink(target, folder / "link.onnx.data")
        _set_external(_first_external(model), location="link.onnx.data")
        if listed:
            body = manifest(folder)
            body["files"].append({"path": "link.onnx.data", "size": target.stat().st_size, "sha256": "0" * 64})
            write_manifest(folder, body)

    return edit


def _subgraph_external(model, folder, marker):
    import onnx

    branch = onnx.helper.make_graph([_constant_node("../outside.bin")], "then", [], [
        onnx.helper.make_tensor_value_info("evil_out", onnx.TensorProto.FLOAT, [4])])
    cond = onnx.helper.make_tensor("evil_cond", onnx.TensorProto.BOOL, [], [True])
    model.graph.initializer.append(cond)
    model.graph.node.append(onnx.helper.make_node("If", ["evil_cond"], ["evil_if"], name="evil_if",
                                                  then_branch=branch, else_branch=branch))


def _sparse_external(model, folder, marker):
    import onnx

    indices = onnx.helper.make_tensor("evil_indices", onnx.TensorProto.INT64, [1], [0])
    sparse = onnx.SparseTensorProto(values=_external_tensor("/etc/hostname", "evil_sparse"), indices=indices)
    sparse.dims.extend([4])
    model.graph.sparse_initializer.append(sparse)


def _custom_domain(model, folder, marker):
    model.graph.node[0].domain = "evil.ops"
    model.opset_import.add(domain="evil.ops", version=1)


def _custom_domain_in_function(model, folder, marker):
    import onnx

    body = onnx.helper.make_node("Payload", ["x"], ["y"], domain="evil.ops")
    function = onnx.helper.make_function("pkg.local", "Wrapper", ["x"], ["y"], [body],
                                         [onnx.helper.make_opsetid("", 24), onnx.helper.make_opsetid("evil.ops", 1)])
    model.functions.append(function)
    model.opset_import.extend([onnx.helper.make_opsetid("pkg.local", 1), onnx.helper.make_opsetid("evil.ops", 1)])
    first = model.graph.node[0]
    model.graph.node.append(onnx.helper.make_node("Wrapper", [first.output[0]], ["evil_y"], domain="pkg.local",
                                                  name="evil_call"))


def _ep_context(model, folder, marker):
    import onnx

    model.graph.node.append(onnx.helper.make_node(
        "EPContext", [model.graph.input[0].name], ["evil_ctx"], name="evil_ctx", domain="com.microsoft",
        embed_mode=0, ep_cache_context="engine.bin", source="TensorrtExecutionProvider"))


def _ort_config(model, folder, marker):
    model.metadata_props.add(key="ort_config", value=json.dumps({"session_options": {"enable_profiling": 1}}))


def _unknown_standard_op(model, folder, marker):
    node = next(n for n in model.graph.node if n.op_type == "Sigmoid")
    node.op_type = "NoSuchOperator"


def _bytes(edit: Callable[[bytes], bytes], name: str | None = None) -> Callable[[Path, Path], None]:
    """Rewrite a file's bytes (the program file when ``name`` is None)."""

    def tamper(folder: Path, marker: Path) -> None:
        path = folder / name if name else program_file(folder)
        path.write_bytes(edit(path.read_bytes()))

    return tamper


_REDO = "re-export the model, or get the export from a trusted source"
ONNX_CASES = [
    Case("external-data-absolute", "onnx", _onnx(_abs_location), ManifestError,
         rf"model\.onnx: initializer '.+' reads external data from '/.*outside\.bin'.*is absolute; {_REDO}"),
    Case("external-data-dotdot", "onnx", _onnx(_dotdot_location), ManifestError,
         r"model\.onnx: initializer .* '\.\./outside\.bin'.*leaves the export directory"),
    Case("external-data-unlisted-file", "onnx", _onnx(_unlisted_copy), ManifestError,
         r"model\.onnx: initializer .* 'copy\.onnx\.data'.*not listed in export\.json"),
    Case("external-data-unlisted-link-out", "onnx", _onnx(_link_out(listed=False)), ManifestError,
         r"model\.onnx: .*'link\.onnx\.data'.*not listed in export\.json"),
    Case("external-data-listed-link-out", "onnx", _onnx(_link_out(listed=True)), ManifestError,
         r"link\.onnx\.data.*link that leaves the export directory"),
    Case("external-data-memory-address", "onnx", _onnx(lambda m, f, k: _set_external(
        _first_external(m), location="*/_ORT_MEM_ADDR_/*", offset=4096)), ManifestError,
         r"model\.onnx: initializer .* reads its data from a memory address"),
    Case("external-data-offset-past-end", "onnx", _onnx(lambda m, f, k: _set_external(
        _first_external(m), offset=10**9)), ManifestError,
         r"model\.onnx: initializer .* reads bytes 1000000000\.\.\d+ of 'model\.onnx\.data', which has \d+"),
    Case("external-data-length-mismatch", "onnx", _onnx(lambda m, f, k: _set_external(
        _first_external(m), length=8)), ManifestError, r"model\.onnx: initializer .* length 8, but .* need \d+ bytes"),
    Case("external-data-in-attribute", "onnx", _onnx(lambda m, f, k: m.graph.node.append(
        _constant_node("/etc/hostname"))), ManifestError,
         r"model\.onnx: node 'evil_constant' attribute 'value' reads external data from '/etc/hostname'"),
    Case("external-data-in-subgraph", "onnx", _onnx(_subgraph_external), ManifestError,
         r"model\.onnx: node 'evil_constant' attribute 'value' .*'\.\./outside\.bin'.*leaves"),
    Case("external-data-sparse-initializer", "onnx", _onnx(_sparse_external), ManifestError,
         r"model\.onnx: sparse initializer 'evil_sparse' \(values\) .*'/etc/hostname'.*absolute"),
    Case("data-file-unlisted", "onnx", _unlist("model.onnx.data"), ManifestError,
         r"model\.onnx: initializer .* 'model\.onnx\.data'.*not listed in export\.json"),
    Case("data-file-truncated", "onnx", _bytes(lambda b: b[:1000], "model.onnx.data"), ManifestError,
         r"model\.onnx: initializer .* reads bytes .* of 'model\.onnx\.data', which has 1000"),
    Case("custom-op-domain", "onnx", _onnx(_custom_domain), ManifestError,
         rf"model\.onnx: node '.+' \(evil\.ops:\w+\) uses the operator domain 'evil\.ops'.*custom-op library.*{_REDO}"),
    Case("custom-op-domain-in-function", "onnx", _onnx(_custom_domain_in_function), ManifestError,
         r"node '' \(evil\.ops:Payload\) in function pkg\.local:Wrapper uses the operator domain 'evil\.ops'"),
    Case("ep-context-node", "onnx", _onnx(_ep_context), ManifestError,
         r"model\.onnx: node 'evil_ctx' \(com\.microsoft:EPContext\) loads code or a precompiled engine"),
    Case("ort-config-metadata", "onnx", _onnx(_ort_config), ManifestError,
         r"model\.onnx: metadata 'ort_config' carries ONNX Runtime session options"),
    Case("graph-truncated", "onnx", _bytes(lambda b: b[: len(b) // 2]), ManifestError,
         rf"model\.onnx: not a valid ONNX protobuf .*{_REDO}"),
    Case("graph-not-protobuf", "onnx", _bytes(lambda b: b"\xff" * 64 + b), ManifestError,
         r"model\.onnx: not a valid ONNX protobuf"),
    # refused by the runtime itself, reported by exported.py's load wrapper: ONNX Runtime itself refuses the op, at session creation
    Case("unknown-standard-op", "onnx", _onnx(_unknown_standard_op), ManifestError,
         r"model\.onnx: the runtime refused it .*NoSuchOperator.*re-export the model"),
]


# --- OpenVINO ------------------------------------------------------------------------------------------------------


def _xml(edit: Callable[[str, Path, Path], str]) -> Callable[[Path, Path], None]:
    def tamper(folder: Path, marker: Path) -> None:
        path = program_file(folder)
        path.write_text(edit(path.read_text(), folder, marker))

    return tamper


def _sub(old: str, new: str, count: int = 1) -> Callable[[str, Path, Path], str]:
    def edit(text: str, folder: Path, marker: Path) -> str:
        assert old in text, old
        return text.replace(old, new, count)

    return edit


def _resub(pattern: str, new: str) -> Callable[[str, Path, Path], str]:
    """A regex replacement, where the saved text varies (OpenVINO numbers model names per process: Model0, Model3)."""
    def edit(text: str, folder: Path, marker: Path) -> str:
        assert re.search(pattern, text), pattern
        return re.sub(pattern, new, text, count=1)

    return edit


_DECL = '<?xml version="1.0"?>'
_FIRST_CONST = re.compile(r'offset="0" size="(\d+)"')


def _entity(text: str, folder: Path, marker: Path) -> str:
    doctype = f'<!DOCTYPE net [<!ENTITY leak SYSTEM "file://{_outside(folder, marker, b"secret")}">]>'
    return text.replace(_DECL, _DECL + "\n" + doctype).replace('name="Model', 'name="&leak;', 1)


def _billion_laughs(text: str, folder: Path, marker: Path) -> str:
    entities = '<!ENTITY a0 "lol">' + "".join(f'<!ENTITY a{i} "{("&a%d;" % (i - 1)) * 10}">' for i in range(1, 10))
    return text.replace(_DECL, f"{_DECL}\n<!DOCTYPE net [{entities}]>").replace('name="Model', 'name="&a9;', 1)


def _const_past_end(text: str, folder: Path, marker: Path) -> str:
    size = (folder / "openvino_model.bin").stat().st_size
    return _FIRST_CONST.sub(lambda m: f'offset="{size}" size="{m.group(1)}"', text, count=1)


def _disguised(folder: Path, marker: Path) -> None:
    """An ONNX protobuf named openvino_model.xml: OpenVINO picks its ONNX frontend by content."""
    import onnx

    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    program_file(folder).write_bytes(model.SerializeToString())


_LAYER = 'type="Sin" version="opset1"'
_PRE_PROCESS = '<pre-process reference-layer-name="input_ids"><channel id="0"><mean value="1"/></channel></pre-process>'
OPENVINO_CASES = [
    Case("xml-external-entity", "openvino", _xml(_entity), ManifestError,
         rf"openvino_model\.xml: has a DOCTYPE \(a DTD\); OpenVINO IR never needs one; {_REDO}"),
    Case("xml-billion-laughs", "openvino", _xml(_billion_laughs), ManifestError, r"openvino_model\.xml: has a DOCTYPE"),
    Case("xml-xinclude", "openvino", _xml(_sub("<rt_info>", '<rt_info><xi:include xmlns:xi='
                                                '"http://www.w3.org/2001/XInclude" href="/etc/passwd" parse="text"/>')),
         ManifestError, r"openvino_model\.xml: has the namespaced element or attribute <xi:include>"),
    Case("xml-processing-instruction", "openvino", _xml(_sub(_DECL, _DECL + '<?xml-stylesheet href="/etc/x"?>')),
         ManifestError, r"openvino_model\.xml: has an XML processing instruction"),
    Case("extension-opset", "openvino", _xml(_sub(_LAYER, 'type="Sin" version="extension"')), ManifestError,
         r"openvino_model\.xml: layer '.+' \(id \d+, type Sin\) is from opset 'extension'.*would need an extension"),
    Case("unknown-op-type", "openvino", _xml(_sub(_LAYER, 'type="Payload" version="opset1"')), ManifestError,
         r"openvino_model\.xml: cannot be read as the openvino program .*Payload"),
    Case("runtime-options", "openvino", _xml(_sub("<rt_info>", '<rt_info><runtime_options><KV_CACHE_PRECISION '
                                                   'value="f32" /></runtime_options>')), ManifestError,
         r"openvino_model\.xml: carries compile options in <rt_info><runtime_options>"),
    Case("pre-process-block", "openvino", _xml(_sub("<layers>", _PRE_PROCESS + "<layers>")), ManifestError,
         r"openvino_model\.xml: has a <pre-process> block in <net>"),
    Case("string-constant", "openvino", _xml(lambda t, f, m: re.sub(
        r'element_type="\w+"( shape="[^"]*" offset="0")', r'element_type="string"\1', t, count=1)), ManifestError,
         r"openvino_model\.xml: layer '.+' \(id \d+, type Const\) is a string constant"),
    Case("const-past-bin-end", "openvino", _xml(_const_past_end), ManifestError,
         r"openvino_model\.xml: layer '.+' \(id \d+, type Const\) reads bytes \d+\.\.\d+ of 'openvino_model\.bin'"),
    Case("bin-truncated", "openvino", _bytes(lambda b: b[:1000], "openvino_model.bin"), ManifestError,
         r"openvino_model\.xml: layer .* reads bytes .* of 'openvino_model\.bin', which has 1000: truncated"),
    Case("bin-unlisted", "openvino", _unlist("openvino_model.bin"), ManifestError,
         r"openvino_model\.xml: its weights file 'openvino_model\.bin' is not listed in export\.json"),
    Case("onnx-disguised-as-xml", "openvino", _disguised, ManifestError,
         r"openvino_model\.xml: is not well-formed XML"),
    Case("xml-truncated", "openvino", _bytes(lambda b: b[: len(b) // 2]), ManifestError,
         rf"openvino_model\.xml: is not well-formed XML \(.* at line \d+, column \d+\): truncated or corrupt; {_REDO}"),
    Case("xml-root-not-net", "openvino", _xml(lambda t, f, m: _DECL + "<model/>"), ManifestError,
         r"openvino_model\.xml: has the root element <model>, not <net>"),
    Case("ir-version-unknown", "openvino", _xml(_resub(r'(<net name="[^"]*") version="11">',
                                                     r'\1 version="99">')), ManifestError,
         r"openvino_model\.xml: is IR version '99'"),
    # refused by the runtime itself, reported by exported.py's load wrapper: OpenVINO itself refuses an edge to a layer that is not there
    Case("edge-to-missing-layer", "openvino", _xml(lambda t, f, m: re.sub(
        r'to-layer="\d+"', 'to-layer="99999"', t, count=1)), ManifestError,
         r"openvino_model\.xml: cannot be read as the openvino program .*re-export the model"),
]


# --- ExecuTorch ----------------------------------------------------------------------------------------------------


def _pte_header(data: bytes) -> tuple[int, int, int]:
    """``(program_size, segment_base_offset, segment_data_size)`` of the ``eh00`` header."""
    return struct.unpack_from("<QQQ", data, 16)


def _fb_field(data: bytes, table: int, index: int) -> int:
    """Where field ``index`` of the flatbuffer table at ``table`` is (the test's own minimal reader)."""
    vtable = table - struct.unpack_from("<i", data, table)[0]
    return table + struct.unpack_from("<H", data, vtable + 4 + 2 * index)[0]


def _fb_ref(data: bytes, pos: int) -> int:
    return pos + struct.unpack_from("<I", data, pos)[0]


def _first_plan(data: bytes) -> int:
    plans = _fb_ref(data, _fb_field(data, _fb_ref(data, 0), 1))
    return _fb_ref(data, plans + 4)


def _overflow(vector: int, data: bytes) -> bytes:
    out = bytearray(data)
    struct.pack_into("<I", out, vector, 0x7FFFFFFF)  # the vector claims 2**31 entries
    return bytes(out)


def _plan_values_count(data: bytes) -> bytes:
    return _overflow(_fb_ref(data, _fb_field(data, _first_plan(data), 2)), data)


def _instructions_count(data: bytes) -> bytes:
    """The first chain's ``instructions`` vector overflows: our check never reads it, the runtime's verifier does."""
    chains = _fb_ref(data, _fb_field(data, _first_plan(data), 5))
    chain = _fb_ref(data, chains + 4)
    return _overflow(_fb_ref(data, _fb_field(data, chain, 2)), data)


def _segment_size(data: bytes) -> bytes:
    segments = _fb_ref(data, _fb_field(data, _fb_ref(data, 0), 4))
    first = _fb_ref(data, segments + 4)
    out = bytearray(data)
    struct.pack_into("<Q", out, _fb_field(data, first, 1), 1 << 40)
    return bytes(out)


def _rename(old: bytes, new: bytes) -> Callable[[bytes], bytes]:
    """Rename the first flatbuffer string ``old`` (same length) in the program part of the file."""
    assert len(old) == len(new)

    def edit(data: bytes) -> bytes:
        at = data.index(struct.pack("<I", len(old)) + old, 0, _pte_header(data)[0]) + 4
        return data[:at] + new + data[at + len(old):]

    return edit


def _xnnpack_key(first_byte: int) -> Callable[[bytes], bytes]:
    """Change the first byte of the first named-data key an XNNPACK blob names (a 64-hex sha256 string)."""

    def edit(data: bytes) -> bytes:
        base = _pte_header(data)[1]
        found = re.search(rb"@\x00\x00\x00[0-9a-f]{64}", data[base:])
        at = base + found.start() + 4
        return data[:at] + bytes([first_byte]) + data[at + 1:]

    return edit


def _header_data_size(data: bytes) -> bytes:
    out = bytearray(data)
    struct.pack_into("<Q", out, 32, _pte_header(data)[2] + 1)
    return bytes(out)


def _ptd_link_out(folder: Path, marker: Path) -> None:
    os.symlink(_outside(folder, marker, b"\0" * 4096), folder / "model.ptd")


EXECUTORCH_CASES = [
    # one non-UTF-8 byte in an XNNPACK constant's key: the runtime logs the key and the Python log bridge aborts
    # the process (SIGABRT) in load_method; see test_the_xnnpack_key_row_aborts_the_runtime_without_our_check
    Case("xnnpack-key-not-utf8", "executorch", _bytes(_xnnpack_key(0xFF)), ManifestError,
         rf"model\.pte: plan 'forward' delegate \d+ \(XnnpackBackend\): XNNPACK constant \d+ names its data with a "
         rf"key that is not UTF-8; {_REDO}"),
    Case("xnnpack-key-unknown", "executorch", _bytes(_xnnpack_key(ord("g"))), ManifestError,
         r"model\.pte: plan 'forward' delegate \d+ \(XnnpackBackend\): XNNPACK constant \d+ takes its data from "
         r"'g[0-9a-f]{63}', which no named data holds"),
    Case("unknown-delegate", "executorch", _bytes(_rename(b"XnnpackBackend", b"HijackBackend1")), ManifestError,
         r"model\.pte: plan 'forward' delegate \d+ \(HijackBackend1\) is not a backend hfexport lowers to"),
    Case("unknown-operator", "executorch", _bytes(_rename(b"aten::full", b"evil::full")), ManifestError,
         r"model\.pte: plan 'forward' calls the operator 'evil::full\.out', which this ExecuTorch runtime has no"),
    Case("segment-past-end", "executorch", _bytes(_segment_size), ManifestError,
         r"model\.pte: segment 0 \(bytes 0\.\.\d+ of the segment data\) lies outside the file"),
    Case("header-past-end", "executorch", _bytes(_header_data_size), ManifestError,
         r"model\.pte: its header puts the program in bytes 0\.\.\d+ and the segments in .*truncated or corrupt"),
    Case("pte-truncated", "executorch", _bytes(lambda b: b[: len(b) // 2]), ManifestError,
         rf"model\.pte: its header .* but the file has \d+: truncated or corrupt; {_REDO}"),
    Case("pte-empty", "executorch", _bytes(lambda b: b""), ManifestError,
         r"model\.pte: 0 bytes is too short for an ExecuTorch file"),
    Case("pte-not-executorch", "executorch", _bytes(lambda b: b"PK\x03\x04" + b"\0" * 4096), ManifestError,
         r"model\.pte: corrupt flatbuffer \(no ET## file identifier with a eh00 header"),
    Case("ptd-unlisted", "executorch", lambda f, m: (f / "model.ptd").write_bytes(b"\0" * 4096), ManifestError,
         r"model\.pte: its data file 'model\.ptd' is not listed in export\.json"),
    Case("ptd-unlisted-link-out", "executorch", _ptd_link_out, ManifestError,
         r"model\.pte: its data file 'model\.ptd' is not listed"),
    Case("ptd-listed-garbage", "executorch", lambda f, m: add_file(f, "model.ptd", b"\x01" * 4096, "model"),
         ManifestError, r"model\.ptd: corrupt flatbuffer \(no FT01 file identifier"),
    Case("values-vector-overflow", "executorch", _bytes(_plan_values_count), ManifestError,
         r"model\.pte: corrupt flatbuffer \(a vector of 2147483647 items at offset \d+ runs past the end\)"),
    # refused by the runtime itself, reported by exported.py's load wrapper: the runtime's own flatbuffer verifier refuses it
    Case("instructions-vector-overflow", "executorch", _bytes(_instructions_count), ManifestError,
         r"model\.pte: cannot be read as the executorch program .*re-export the model"),
]

FORMAT_CASES: list[Case] = ONNX_CASES + OPENVINO_CASES + EXECUTORCH_CASES
"""Every row, for the main table in tests/test_security.py (which runs them)."""


def test_the_table_covers_the_three_formats():
    assert len(FORMAT_CASES) >= 30
    assert {c.fmt for c in FORMAT_CASES} == {"onnx", "openvino", "executorch"}
    assert len({(c.fmt, c.id) for c in FORMAT_CASES}) == len(FORMAT_CASES)


# --- honest exports still load --------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["onnx", "openvino", "executorch"])
def test_an_honest_export_loads_and_runs_like_eager(fmt, saved_exports, tiny_model):
    reloaded = ExportedModel.from_pretrained(saved_exports(fmt))
    with torch.no_grad():
        expected = tiny_model(**inputs()).logits
    assert torch.allclose(reloaded(**inputs()).logits, expected, atol=ATOL)


# ExecuTorch's in the sweep, for time (a minute): by default test_cli_e2e loads a saved ExecuTorch generation
# export (static cache, multi-token decode) through the same checks in a fresh process
@pytest.mark.parametrize("fmt", ["onnx", "openvino", pytest.param("executorch", marks=pytest.mark.sweep)])
def test_an_honest_generation_export_loads_and_generates_the_same(fmt, tiny_model, tmp_path):
    """Decode graphs (ONNX's shared weights file, OpenVINO's stateful variables, ExecuTorch's llama custom ops)
    pass the checks too."""
    import hfexport

    exporter, config = {
        "onnx": (hfexport.OnnxExporter, hfexport.OnnxConfig(dynamic=True, ort_fusions="cpu")),
        "openvino": (hfexport.OpenVINOExporter, hfexport.OpenVINOConfig(dynamic=True)),
        "executorch": (hfexport.ExecutorchExporter, hfexport.ExecutorchConfig(dynamic=True)),
    }[fmt]
    prompt = CASE.inputs(2, 6)
    exported = exporter().export_for_generation(tiny_model, prompt, config)
    exported.save_pretrained(tmp_path)
    reloaded = ExportedModel.from_pretrained(tmp_path)
    assert torch.equal(reloaded.generate(**prompt, max_new_tokens=4), exported.generate(**prompt, max_new_tokens=4))


@pytest.fixture(scope="module")
def tied_executorch(tmp_path_factory):
    """A tied-weights model (tiny Gemma 3) exported to ExecuTorch: its weights go to a ``.ptd``. Static shapes: the
    checks call it at its own shapes, and the dynamic export took twice as long (35 s against 18 s alone)."""
    import hfexport
    from hfexport.testing.tiny import TINY_CASES

    case = TINY_CASES["gemma3"]
    model = case.build()
    folder = tmp_path_factory.mktemp("tied") / "export"
    hfexport.ExecutorchExporter().export(model, case.inputs(2, 7), hfexport.ExecutorchConfig(dynamic=False)) \
        .save_pretrained(folder)
    assert (folder / "model.ptd").is_file()
    return model, case, folder


def test_an_honest_ptd_export_loads_and_runs_like_eager(tied_executorch):
    model, case, folder = tied_executorch
    with torch.no_grad():
        expected = model(**case.inputs(2, 7)).logits
    assert torch.allclose(ExportedModel.from_pretrained(folder)(**case.inputs(2, 7)).logits, expected, atol=ATOL)


def _tensor_name_not_utf8(folder: Path) -> None:
    """A byte of the first program tensor's name (``model.*``, its key in the .ptd) made non-UTF-8: the runtime
    logs the name when the key is missing, and the Python log bridge aborts the process on it."""
    data = bytearray((folder / "model.pte").read_bytes())
    found = re.search(rb"[\x01-\x7f]\x00\x00\x00(model\.[\w.]+)", bytes(data[: _pte_header(bytes(data))[0]]))
    data[found.start(1) + 3] = 0xFF
    (folder / "model.pte").write_bytes(bytes(data))


def _ptd_truncated(folder: Path) -> None:
    data = (folder / "model.ptd").read_bytes()
    (folder / "model.ptd").write_bytes(data[: len(data) // 2])


def _ptd_key_renamed(folder: Path) -> None:
    """Rename the .ptd's first named-data key: the program tensor that takes its data from it finds none."""
    data = bytearray((folder / "model.ptd").read_bytes())
    found = re.search(rb"([\x01-\x7f])\x00\x00\x00(model\.[\w.]+)", bytes(data))
    data[found.start(2)] = ord("X")
    (folder / "model.ptd").write_bytes(bytes(data))


@pytest.mark.parametrize("tamper, match", [
    (_ptd_truncated, r"model\.ptd: its header places data up to byte \d+, but the file has \d+: truncated"),
    (_ptd_key_renamed, r"model\.pte: plan 'forward' value \d+ \(a tensor\) takes its data from 'model\..*', which "
                       r"no named data holds"),
    (_tensor_name_not_utf8, r"model\.pte: corrupt flatbuffer \(the string at offset \d+ is not UTF-8"),
    (lambda f: _unlist("model.ptd")(f, f), r"model\.pte: its data file 'model\.ptd' is not listed"),
], ids=["truncated", "key-renamed", "tensor-name-not-utf8", "unlisted"])
def test_a_tampered_ptd_is_refused(tied_executorch, tmp_path, tamper, match):
    folder = copy_export(tied_executorch[2], tmp_path / "export")
    tamper(folder)
    reseal(folder)
    with pytest.raises(ManifestError) as info:
        ExportedModel.from_pretrained(folder)
    assert re.search(match, str(info.value), re.S), str(info.value)


def _hub_snapshot(source: Path, cache: Path) -> Path:
    """``source`` laid out as a Hub cache snapshot: every file a relative link into the repo's ``blobs/``."""
    repo = cache / "models--org--name"
    snapshot = repo / "snapshots" / ("0123456789abcdef" * 3)[:40]
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in source.iterdir():
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        blob.write_bytes(path.read_bytes())
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    return snapshot


@pytest.mark.parametrize("fmt", ["onnx", "openvino", "executorch"])
def test_a_hub_snapshot_of_links_into_blobs_still_loads(fmt, saved_exports, tiny_model, tmp_path):
    """The checks allow what the manifest allows: a snapshot's links into its own repo's blobs/."""
    snapshot = _hub_snapshot(saved_exports(fmt), tmp_path / "cache")
    with torch.no_grad():
        expected = tiny_model(**inputs()).logits
    assert torch.allclose(ExportedModel.from_pretrained(snapshot)(**inputs()).logits, expected, atol=ATOL)


# --- the ExecuTorch crash, in a subprocess --------------------------------------------------------------------------

_RUNTIME_ALONE = textwrap.dedent("""
    import os, sys
    from executorch.runtime import Runtime
    from hfexport.backends.executorch.custom_sdpa import register_llama_kernels
    register_llama_kernels()
    ptd = sys.argv[1][:-4] + ".ptd"
    program = Runtime.get().load_program(sys.argv[1], data_path=ptd if os.path.exists(ptd) else None)
    try:
        program.load_method("forward")
    except RuntimeError as e:
        print("raised", e)
""")
_WITH_HFEXPORT = textwrap.dedent("""
    import sys
    from hfexport import ExportedModel, ManifestError
    try:
        ExportedModel.from_pretrained(sys.argv[1])
    except ManifestError as e:
        print("refused", e)
""")


def _run(code: str, arg: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, str(arg)], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("which", ["xnnpack-key", pytest.param("tensor-name", marks=pytest.mark.sweep)])  # (~15 s)
def test_a_non_utf8_name_aborts_the_runtime_without_our_check(which, saved_exports, tied_executorch, tmp_path):
    """The rows are live: the ExecuTorch runtime alone kills the process (SIGABRT: it logs the name, and the Python
    log bridge throws on the undecodable bytes inside C++); through hfexport the same file is a ManifestError."""
    if which == "xnnpack-key":
        folder = copy_export(saved_exports("executorch"), tmp_path / "export")
        _bytes(_xnnpack_key(0xFF))(folder, tmp_path / "pwned")
    else:
        folder = copy_export(tied_executorch[2], tmp_path / "export")
        _tensor_name_not_utf8(folder)
    reseal(folder)
    alone = _run(_RUNTIME_ALONE, program_file(folder))
    assert alone.returncode < 0, (
        f"the ExecuTorch runtime no longer aborts on this file (rc={alone.returncode}, {alone.stdout[-300:]}): the "
        "check still guards, but this evidence is stale")
    guarded = _run(_WITH_HFEXPORT, folder)
    assert guarded.returncode == 0, guarded.stderr[-2000:]
    assert "refused" in guarded.stdout and "not UTF-8" in guarded.stdout, guarded.stdout[-2000:]
