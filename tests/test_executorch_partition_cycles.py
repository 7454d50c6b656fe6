"""executorch-partition-cycles: a partition that reaches itself through an outside node is split into its valid
connected pieces (or left to the portable kernels), so that ``fuse_as_graphmodule`` never meets a cycle (Pegasus-X's
dynamic encoder failed its whole lowering: "Invalid partition, found dependency cycles")."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch", reason="the ExecuTorch backend's own package (pip install hfexport[executorch])")

from torch.fx.passes.utils.fuser_utils import validate_partition  # noqa: E402

from hfexport.workarounds.executorch_partition_cycles import split_cyclic_partitions  # noqa: E402


class _OutAndBack(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x + 1
        b = a.sin()  # outside every partition
        c = a * 2
        return (c + b) - 3


def _tagged(names: dict[str, str]):
    from executorch.exir.backend.partitioner import DelegationSpec, PartitionResult

    program = torch.export.export(_OutAndBack(), (torch.randn(4),))
    nodes = {n.name: n for n in program.graph.nodes}
    for name, tag in names.items():
        nodes[name].meta["delegation_tag"] = tag
    spec = DelegationSpec("XnnpackBackend", [])
    return PartitionResult(program, {tag: spec for tag in set(names.values())}), nodes


def _partitions(result):
    tags: dict[str, list] = {}
    for node in result.tagged_exported_program.graph.nodes:
        if node.meta.get("delegation_tag"):
            tags.setdefault(node.meta["delegation_tag"], []).append(node.name)
    return tags


def test_a_partition_joined_only_through_an_outside_node_becomes_two_valid_partitions():
    result, nodes = _tagged({"add": "tag0", "add_1": "tag0"})  # a and c + b: a -> sin -> add_1 leaves and comes back
    assert not validate_partition([nodes["add"], nodes["add_1"]])  # the premise: fuse_as_graphmodule refuses it
    assert split_cyclic_partitions(result) == 1
    parts = _partitions(result)
    assert sorted(parts.values()) == [["add"], ["add_1"]] and set(parts) == set(result.partition_tags)
    for names in parts.values():
        assert validate_partition([nodes[n] for n in names])


def test_a_cyclic_piece_that_stays_connected_inside_is_left_outside_and_a_valid_partition_is_kept():
    result, nodes = _tagged({"add": "tag0", "mul": "tag0", "add_1": "tag0", "sub": "tag1"})
    assert split_cyclic_partitions(result) == 1
    assert _partitions(result) == {"tag1": ["sub"]} and set(result.partition_tags) == {"tag1"}


class _Mutual(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = x + 1
        b = a.sin()
        c = x * 2
        return a + c, b


def _fuse(result):
    """torch's own sequential fusion, as ExecuTorch lowers the partitions (fuse_as_graphmodule per partition)."""
    import copy

    from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

    module = copy.deepcopy(result.tagged_exported_program.graph_module)
    parts: dict[str, dict] = {}
    for node in module.graph.nodes:
        if node.op == "call_function" and node.meta.get("delegation_tag"):
            parts.setdefault(node.meta["delegation_tag"], {})[node] = None
    return fuse_by_partitions(module, list(parts.values()))


def test_two_partitions_valid_alone_that_need_each_other_once_fused_are_split():
    """{x + 1, a + c} and {a.sin(), x * 2}: neither leaves and comes back through a plain node, but fused one after
    the other each becomes one node that needs the other."""
    from executorch.exir.backend.partitioner import DelegationSpec, PartitionResult

    program = torch.export.export(_Mutual(), (torch.randn(4),))
    nodes = {n.name: n for n in program.graph.nodes}
    tags = {"add": "tag0", "add_1": "tag0", "sin": "tag1", "mul": "tag1"}
    for name, tag in tags.items():
        nodes[name].meta["delegation_tag"] = tag
    result = PartitionResult(program, dict.fromkeys(("tag0", "tag1"), DelegationSpec("XnnpackBackend", [])))
    assert validate_partition([nodes["add"], nodes["add_1"]]) and validate_partition([nodes["sin"], nodes["mul"]])
    with pytest.raises(AssertionError, match="dependency cycles"):  # the premise
        _fuse(result)
    assert split_cyclic_partitions(result) == 1
    _fuse(result)  # no cycle left
    # x + 1 feeds a + c directly: that piece stays one and has the path, so it is left to the portable kernels
    assert sorted(n for v in _partitions(result).values() for n in v) == ["mul", "sin"]
