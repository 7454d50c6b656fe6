"""Tampered ``.pt2`` archives for the security table: payloads torch would run, members it would trust.

Each tamper rewrites members of the folder's program archive; :func:`live_without_our_check` proves, for the payload
rows, that torch itself runs the payload when our check is bypassed (so the refusal is what keeps the marker away).
"""

from __future__ import annotations

import io
import json
import pickle
import zipfile
from collections.abc import Callable
from pathlib import Path

from hfexport import ManifestError
from security_support import Case, marker_payload, program_file


class _Payload:
    """Unpickling it runs ``exec(source)``."""

    def __init__(self, source: str):
        self.source = source

    def __reduce__(self):
        return (exec, (self.source,))


def pickle_payload(marker: Path) -> bytes:
    return pickle.dumps(_Payload(marker_payload(marker)), protocol=2)


def torch_pickle_payload(marker: Path) -> bytes:
    """A ``torch.save`` file (zip) whose pickle runs the payload: what ``torch.load(weights_only=False)`` reads."""
    import torch

    buffer = io.BytesIO()
    torch.save(_Payload(marker_payload(marker)), buffer)
    return buffer.getvalue()


def rewrite_members(archive: Path, change: Callable[[dict[str, bytes]], None]) -> None:
    """Rewrite the zip ``archive``: ``change`` edits ``{member name without the root folder: bytes}`` in place."""
    with zipfile.ZipFile(archive) as z:
        names = z.namelist()
        root = names[0].split("/", 1)[0] + "/"
        members = {n[len(root):]: z.read(n) for n in names}
    change(members)
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(root + name, data)


def _edit_json(member: str, edit: Callable[[dict], None]) -> Callable[[dict[str, bytes]], None]:
    def change(members: dict[str, bytes]) -> None:
        body = json.loads(members[member])
        edit(body)
        members[member] = json.dumps(body).encode()

    return change


_WEIGHTS = "data/weights/model_weights_config.json"
_CONSTANTS = "data/constants/model_constants_config.json"
_GRAPH = "models/model.json"


def _pickled_weight(folder: Path, marker: Path) -> None:
    def change(members: dict[str, bytes]) -> None:
        config = json.loads(members[_WEIGHTS])
        entry = next(iter(config["config"].values()))
        entry["use_pickle"] = True
        members["data/weights/" + entry["path_name"]] = torch_pickle_payload(marker)
        members[_WEIGHTS] = json.dumps(config).encode()

    rewrite_members(program_file(folder), change)


def _constants_at(config: dict) -> list[dict]:
    """The constants entries that share the first entry's payload (torch aliases one payload for several)."""
    first = next(iter(config["config"].values()))["path_name"]
    return [e for e in config["config"].values() if e["path_name"] == first]


def _pickled_constant(folder: Path, marker: Path) -> None:
    def change(members: dict[str, bytes]) -> None:
        config = json.loads(members[_CONSTANTS])
        entries = _constants_at(config)
        for entry in entries:
            entry["use_pickle"] = True
        members["data/constants/" + entries[0]["path_name"]] = torch_pickle_payload(marker)
        members[_CONSTANTS] = json.dumps(config).encode()

    rewrite_members(program_file(folder), change)


def _object_constant(prefix: str) -> Callable[[Path, Path], None]:
    def tamper(folder: Path, marker: Path) -> None:
        def change(members: dict[str, bytes]) -> None:
            config = json.loads(members[_CONSTANTS])
            for entry in _constants_at(config):
                entry["path_name"], entry["use_pickle"] = f"{prefix}0", True  # as torch writes an opaque object
            members[f"data/constants/{prefix}0"] = pickle_payload(marker)
            members[_CONSTANTS] = json.dumps(config).encode()

        rewrite_members(program_file(folder), change)

    return tamper


def _sample_inputs(folder: Path, marker: Path) -> None:
    def change(members: dict[str, bytes]) -> None:
        members["data/sample_inputs/model.pt"] = torch_pickle_payload(marker)

    rewrite_members(program_file(folder), change)


def _extra_member(name: str, data: Callable[[Path], bytes]) -> Callable[[Path, Path], None]:
    def tamper(folder: Path, marker: Path) -> None:
        def change(members: dict[str, bytes]) -> None:
            members[name] = data(marker)

        rewrite_members(program_file(folder), change)

    return tamper


def _emptied_weight(folder: Path, marker: Path) -> None:
    def change(members: dict[str, bytes]) -> None:
        config = json.loads(members[_WEIGHTS])
        entry = next(iter(config["config"].values()))
        members["data/weights/" + entry["path_name"]] = b""

    rewrite_members(program_file(folder), change)


def _sympy_payload(folder: Path, marker: Path) -> None:
    def edit(graph: dict) -> None:
        values = graph["graph_module"]["graph"]["sym_int_values"]
        name = next(iter(values))
        values[name] = {"as_expr": {"expr_str": f"exec({marker_payload(marker)!r}) or 1", "hint": None}}

    rewrite_members(program_file(folder), _edit_json(_GRAPH, edit))


def _guard_payload(folder: Path, marker: Path) -> None:
    def edit(graph: dict) -> None:
        # single quotes only: torch pastes the guard into a double-quoted message
        graph["guards_code"] = [f"exec(bytes.fromhex('{marker_payload(marker).encode().hex()}').decode()) is None"]

    rewrite_members(program_file(folder), _edit_json(_GRAPH, edit))


def _node_target(target: str) -> Callable[[Path, Path], None]:
    def tamper(folder: Path, marker: Path) -> None:
        def edit(graph: dict) -> None:
            node = next(n for n in graph["graph_module"]["graph"]["nodes"] if n["target"].startswith("torch.ops."))
            node["target"] = target

        rewrite_members(program_file(folder), _edit_json(_GRAPH, edit))

    return tamper


def _second_model(folder: Path, marker: Path) -> None:
    def change(members: dict[str, bytes]) -> None:
        members["models/evil.json"] = members[_GRAPH]

    rewrite_members(program_file(folder), change)


def _not_a_zip(folder: Path, marker: Path) -> None:
    program_file(folder).write_bytes(b"PK\x03\x04 this is not an archive" * 10)


def _truncated(folder: Path, marker: Path) -> None:
    path = program_file(folder)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _unreadable_graph(folder: Path, marker: Path) -> None:
    def change(members: dict[str, bytes]) -> None:
        members[_GRAPH] = b"{" * 200_000

    rewrite_members(program_file(folder), change)


PAYLOADS = {
    "pickled-weight": _pickled_weight,
    "pickled-constant": _pickled_constant,
    "opaque-object-constant": _object_constant("opaque_obj_"),
    "sample-inputs-pickle": _sample_inputs,
    "sympy-expression": _sympy_payload,
    "guard-code": _guard_payload,
}
"""Rows whose payload torch itself runs without our check (see :func:`live_without_our_check`)."""

PT2_CASES = [
    Case("pickled-weight", "dynamo", _pickled_weight, ManifestError, r"weight_\d+ is a pickle .*weights_only=True"),
    Case("pickled-constant", "dynamo", _pickled_constant, ManifestError, r"tensor_\d+ is a pickle .*weights_only"),
    Case("opaque-object-constant", "dynamo", _object_constant("opaque_obj_"), ManifestError,
         r"opaque_obj_0.*custom or opaque objects"),
    Case("custom-object-constant", "dynamo", _object_constant("custom_obj_"), ManifestError,
         r"custom_obj_0.*custom or opaque objects"),
    Case("sample-inputs-pickle", "dynamo", _sample_inputs, ManifestError,
         r"sample_inputs/model.pt holds objects outside the allowed types.*could run code"),
    Case("aotinductor-library", "dynamo", _extra_member("data/aotinductor/model/evil.so", lambda m: b"\x7fELF"),
         ManifestError, r"data/aotinductor/model/evil.so.*not one hfexport writes"),
    Case("legacy-weights-pickle", "dynamo", _extra_member("data/weights/model.pt", pickle_payload), ManifestError,
         r"data/weights/model.pt.*not one hfexport writes"),
    Case("second-model", "dynamo", _second_model, ManifestError, r"models/evil.json.*not one hfexport writes"),
    Case("emptied-weight", "dynamo", _emptied_weight, ManifestError, r"holds 0 bytes.*truncated or emptied"),
    Case("sympy-expression", "dynamo", _sympy_payload, ManifestError, r"symbolic size expression.*outside"),
    Case("guard-code", "dynamo", _guard_payload, ManifestError, r"input guard.*outside"),
    Case("target-torch-save", "dynamo", _node_target("torch.save"), ManifestError,
         r"target 'torch.save'.*a Python function"),
    Case("target-from-file", "dynamo", _node_target("torch.ops.aten.from_file.default"), ManifestError,
         r"from_file.*reaches outside the graph"),
    Case("target-hub-load", "dynamo", _node_target("torch.hub.load"), ManifestError, r"torch.hub.load.*Python"),
    Case("not-a-zip", "dynamo", _not_a_zip, ManifestError, r"model.pt2: not a .pt2 archive"),
    Case("truncated-program", "dynamo", _truncated, ManifestError, r"model.pt2: not a .pt2 archive"),
    Case("graph-not-json", "dynamo", _unreadable_graph, ManifestError, r"models/model.json is not readable JSON"),
]
