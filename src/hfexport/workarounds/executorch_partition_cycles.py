"""ExecuTorch / XNNPACK: partitions that would depend on themselves once fused are split, not lowered as they are.

ExecuTorch fuses the partitions XNNPACK's configuration-based partitioner tags one after the other
(``fuse_as_graphmodule``), each becoming one node whose outputs depend on all its inputs. Two partitions that are
each valid alone can then need each other (one reads an output of the other, which reads an output of the first),
and the second fusion refuses the whole lowering: "Invalid partition, found dependency cycles" (executorch 1.5.1;
Pegasus-X's encoder with a dynamic sequence: 1 of its 27 partitions). ExecuTorch's Arm backend checks its own
partitions for cycles (pytorch/executorch#18191). After XNNPACK has partitioned, each partition is checked for a path
that leaves it and comes back, through plain nodes or through other partitions (each taken as one node); one that
has such a path is split into its connected pieces, each a partition of its own where it has none and left to the
portable kernels where it has, and the constants it read follow the piece that reads them. Drop it once the
partitioner never proposes such partitions.
"""

from __future__ import annotations

from typing import Any

from .registry import run_after, workaround

__all__ = ["split_cyclic_partitions"]

_TAG = "delegation_tag"


def split_cyclic_partitions(result: Any) -> int:
    """Split every partition of ``result`` (a ``PartitionResult``) that forms a dependency cycle, in place; returns
    how many were split. A cycle may run through other partitions: ExecuTorch fuses the partitions one after the
    other, and a fused partition is one node whose outputs depend on all its inputs, so each partition is checked
    with every other one taken as a single node."""
    nodes = list(result.tagged_exported_program.graph_module.graph.nodes)
    split, changed = 0, True
    while changed:
        changed = False
        groups = _groups(nodes)
        for tag, members in groups.items():
            if not _cyclic(members, groups):
                continue
            split, changed = split + 1, True
            spec = result.partition_tags.pop(tag)
            for i, piece in enumerate(_connected(members)):
                new = f"{tag}_{i}"
                for node in piece:
                    node.meta[_TAG] = new
                if _cyclic(piece, _groups(nodes)):
                    for node in piece:
                        node.meta.pop(_TAG)
                else:
                    result.partition_tags[new] = spec
            _retag_constants(nodes, tag)
            break  # the groups changed: check them all again
    return split


def _groups(nodes: list[Any]) -> dict[str, list[Any]]:
    groups: dict[str, list[Any]] = {}
    for node in nodes:
        if node.op == "call_function" and node.meta.get(_TAG):
            groups.setdefault(node.meta[_TAG], []).append(node)
    return groups


def _cyclic(members: list[Any], groups: dict[str, list[Any]]) -> bool:
    """Whether a path leaves ``members`` and comes back, each other partition being one node."""
    inside = set(members)
    tag = members[0].meta.get(_TAG)
    stack = [user for node in members for user in node.users if user not in inside]
    seen: set[Any] = set()
    while stack:
        node = stack.pop()
        if node in inside:
            return True
        if node in seen:
            continue
        other = node.meta.get(_TAG) if node.op == "call_function" else None
        group = groups.get(other, [node]) if other not in (None, tag) else [node]
        seen.update(group)
        stack.extend(user for member in group for user in member.users)
    return False


def _retag_constants(nodes: list[Any], tag: str) -> None:
    """The constants a split partition read: with the one piece that reads them, else outside."""
    for node in nodes:
        if node.op != "call_function" and node.meta.get(_TAG) == tag:
            tags = {user.meta.get(_TAG) for user in node.users}
            node.meta.pop(_TAG)
            if len(tags) == 1 and None not in tags:
                node.meta[_TAG] = tags.pop()


def _connected(members: list[Any]) -> list[list[Any]]:
    """The pieces of ``members`` joined by edges between members (either direction), each in graph order."""
    inside = set(members)
    piece_of: dict[Any, int] = {}
    pieces: list[list[Any]] = []
    for start in members:
        if start in piece_of:
            continue
        piece_of[start], stack, found = len(pieces), [start], [start]
        while stack:
            node = stack.pop()
            for other in (*node.all_input_nodes, *node.users):
                if other in inside and other not in piece_of:
                    piece_of[other] = len(pieces)
                    stack.append(other)
                    found.append(other)
        pieces.append(found)
    order = {node: i for i, node in enumerate(members)}
    return [sorted(piece, key=order.__getitem__) for piece in pieces]


@workaround(
    id="executorch-partition-cycles",
    backend="executorch",
    target="executorch.backends.xnnpack.partition.xnnpack_partitioner.XnnpackPartitioner.partition",
    breaks="partitions that need each other once fused fail the whole lowering: 'Invalid partition, found "
    "dependency cycles' (Pegasus-X's encoder, dynamic)",
    upstream="executorch exir/backend/canonical_partitioners/config_partitioner.py (the Arm backend's own check: "
    "pytorch/executorch#18191)",
    versions={"executorch": ">=1.0,<1.6"},
)
def _apply(model: Any, inputs: dict):
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

    return run_after(XnnpackPartitioner, "partition", lambda result, *_: split_cyclic_partitions(result))
