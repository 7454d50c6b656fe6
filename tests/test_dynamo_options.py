"""DynamoConfig options end to end: the spec's explicit Dim example, strict mode, static shapes, devices."""

from __future__ import annotations

import pytest
import torch

from hfexport import AutoExportConfig, AutoHfExporter, DynamoConfig, DynamoExporter, ExportMetadata, UnsupportedError
from hfexport.testing.tiny import TINY_CASES
from hfexport.validation import compare_outputs


def _close(exported, model, inputs):
    with torch.no_grad():
        return compare_outputs(exported(**inputs), model(**inputs))["max_abs_diff"] <= 1e-4


def test_spec_example_explicit_dims_with_deferred_asserts():
    case = TINY_CASES["qwen3"]
    model = case.build()
    inputs = case.inputs(2, 7)
    batch = torch.export.Dim("batch", min=1, max=32)
    seq = torch.export.Dim("seq", min=1, max=2048)
    config = DynamoConfig(
        dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
        prefer_deferred_runtime_asserts_over_guards=True,
    )
    exported = DynamoExporter().export(model, inputs, config=config)
    shape = exported.components["model"].metadata.inputs[0].shape
    assert all(isinstance(d, str) for d in shape), shape
    assert _close(exported, model, case.inputs(5, 19))
    saved = exported.components["model"].metadata.export_config["dynamic_shapes"]
    assert saved["input_ids"] == {"__dims__": [[0, {"dim": "batch", "min": 1, "max": 32}],
                                               [1, {"dim": "seq", "min": 1, "max": 2048}]]}


def test_explicit_dims_for_an_unknown_input_are_refused():
    case = TINY_CASES["llama"]
    config = DynamoConfig(dynamic_shapes={"input_idz": {0: torch.export.Dim("b")}})
    with pytest.raises(ValueError, match="input_idz"):
        DynamoExporter().export(case.build(), case.inputs(2, 7), config=config)


def test_strict_mode_export_matches_eager():
    case = TINY_CASES["bert"]
    model = case.build()
    exported = DynamoExporter().export(model, case.inputs(2, 7), config=DynamoConfig(dynamic=True, strict=True))
    assert _close(exported, model, case.inputs(3, 9))


def test_static_export_refuses_other_shapes_clearly():
    case = TINY_CASES["llama"]
    model = case.build()
    exported = DynamoExporter().export(model, case.inputs(2, 7), config=DynamoConfig())
    assert exported.components["model"].metadata.inputs[0].shape == [2, 7]
    assert _close(exported, model, case.inputs(2, 7))
    with pytest.raises(UnsupportedError, match="outside the shapes"):
        exported(**case.inputs(1, 5))


def test_auto_classes_from_a_dict_and_to_cpu():
    case = TINY_CASES["gpt2"]
    model = case.build()
    config = AutoExportConfig.from_dict({"export_format": "dynamo", "dynamic": True})
    exporter = AutoHfExporter.from_config(config)
    exported = exporter.export(model, case.inputs(2, 7), config=config).to("cpu")
    assert isinstance(exported.program, torch.export.ExportedProgram)
    assert _close(exported, model, case.inputs(1, 4))


def test_backend_not_in_this_release_is_a_clear_error():
    from hfexport import registry

    config = AutoExportConfig.from_dict({"export_format": "onnx"})
    try:
        exporter = AutoHfExporter.from_config(config)
    except UnsupportedError as e:
        assert "onnx" in str(e)
    else:  # the backend exists: it must then be the ONNX exporter
        assert type(exporter).__name__ == "OnnxExporter"
    assert registry.config_class_for("onnx").__name__ == "OnnxConfig"


def test_metadata_from_dict_skips_unknown_keys():
    case = TINY_CASES["llama"]
    exported = DynamoExporter().export(case.build(), case.inputs(2, 7), config=DynamoConfig())
    data = exported.components["model"].metadata.to_dict()
    data["field_from_a_newer_version"] = {"x": 1}
    again = ExportMetadata.from_dict(data)
    assert again.to_dict() == exported.components["model"].metadata.to_dict()
    assert [s.role.value for s in again.inputs] == ["input", "input"]


def test_gqa_models_trace_grouped_sdpa_instead_of_copying_the_cache():
    case = TINY_CASES["llama"]  # 4 query heads, 2 K/V heads
    model = case.build()
    exported = DynamoExporter().export(model, case.inputs(2, 7), config=DynamoConfig(dynamic=True))
    assert "dynamo-sdpa-gqa" in exported.components["model"].metadata.workarounds
    graph = exported.program.graph
    sdpa = [n for n in graph.nodes if "scaled_dot_product_attention" in str(n.target)]
    assert sdpa and all(n.kwargs.get("enable_gqa") for n in sdpa)
    assert not any("expand" in str(n.target) and "repeat" in n.name for n in graph.nodes)
    assert _close(exported, model, case.inputs(3, 9))
    mha = TINY_CASES["gpt2"]
    plain = DynamoExporter().export(mha.build(), mha.inputs(2, 7), config=DynamoConfig(dynamic=True))
    assert "dynamo-sdpa-gqa" not in plain.components["model"].metadata.workarounds


def test_a_config_whose_heads_vary_by_layer_exports():
    """EmbeddingGemma 2's config refuses a global ``num_key_value_heads`` (its last layer has its own head count):
    the GQA workaround's check read it and the whole export raised transformers' error."""
    from transformers import EmbeddingGemma2TextConfig, EmbeddingGemma2TextModel

    config = EmbeddingGemma2TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       layer_types=["sliding_attention", "full_attention"],
                                       per_layer_config={"1": {"head_dim": 32, "num_key_value_heads": 1}})
    with pytest.raises(RuntimeError, match="per-layer attribute"):  # the premise: the global read refuses
        config.num_key_value_heads
    torch.manual_seed(0)
    model = EmbeddingGemma2TextModel(config).eval()
    inputs = {"input_ids": torch.randint(3, 250, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)}
    exported = DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    assert "dynamo-sdpa-gqa" in exported.components["model"].metadata.workarounds
    assert _close(exported, model, {"input_ids": torch.randint(3, 250, (3, 9)),
                                    "attention_mask": torch.ones(3, 9, dtype=torch.long)})


@pytest.fixture(scope="module")
def static_llama():
    """The tiny Llama exported with a static cache of 64 and one multi-token decode graph, traced at batch 2."""
    import copy

    case = TINY_CASES["llama"]
    model = case.build()
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample, gen.cache_implementation, gen.max_cache_len = False, "static", 64
    exported = DynamoExporter().export_for_generation(
        model, case.inputs(2, 6), DynamoConfig(dynamic=True), generation_config=gen, multi_token_decode=True
    )
    return case, model, gen, exported


def test_static_multi_token_decode_serves_the_prefill_and_saves_one_program(tmp_path, static_llama):
    """One graph for prompt and steps: one .pt2 (the weights once), and generate() still equals eager (a static
    cache fixes the batch size at export: 2 here)."""
    import json

    from hfexport import ExportedModel

    case, model, gen, exported = static_llama
    assert exported.components["prefill"] is exported.components["decode"]
    exported.save_pretrained(tmp_path)
    manifest = json.loads((tmp_path / "export.json").read_text())
    assert {c["program"] for c in manifest["components"].values()} == {"decode.pt2"}
    assert sorted(p.name for p in tmp_path.glob("*.pt2")) == ["decode.pt2"]
    reloaded = ExportedModel.from_pretrained(tmp_path)
    assert reloaded.components["prefill"].program is reloaded.components["decode"].program
    prompt = case.inputs(2, 9)
    prompt["attention_mask"][1, :3] = 0
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=12, generation_config=gen)
    assert torch.equal(reloaded.generate(**prompt, max_new_tokens=12, generation_config=gen), expected)


def test_static_cache_made_for_another_batch_runs_in_place_or_fails_clearly(static_llama):
    """torch.export compares a cache's whole pytree context, which for a StaticCache records ``batch_size``: a cache
    the caller built at batch 3 runs on a batch-dynamic export traced at batch 2 (its tensors rebound into the traced
    structure, so the write lands in the caller's cache), and a fresh, still unallocated StaticCache is allocated
    at the call's batch and written, as the eager forward does with it (what a captured prefill's cache is)."""
    import copy

    from transformers import StaticCache

    case, model, gen, exported = static_llama
    decode = exported.runner("decode")
    prompt = case.inputs(3, 9, padded=False)
    mask = (torch.arange(64) <= 9).view(1, 1, 1, 64).expand(3, 1, 1, 64)
    step = {"input_ids": torch.tensor([[5], [7], [11]]), "position_ids": torch.full((3, 1), 9), "attention_mask": mask}
    fresh, eager_fresh = (StaticCache(config=model.config, max_cache_len=64) for _ in range(2))
    got = decode(**step, past_key_values=fresh)
    with torch.no_grad():
        want = model(**step, past_key_values=eager_fresh).logits  # the same call, eager
    assert (got.logits - want).abs().max().item() <= 1e-4
    assert fresh.layers[0].keys.shape[0] == 3  # allocated at the call's batch
    assert (fresh.layers[0].keys - eager_fresh.layers[0].keys).abs().max().item() <= 1e-5

    cache = StaticCache(config=model.config, max_cache_len=64)
    with torch.no_grad():
        model(**prompt, past_key_values=cache, use_cache=True)  # eager prefill allocates it at batch 3
        twin = copy.deepcopy(cache)
        want = model(input_ids=step["input_ids"], past_key_values=twin, cache_position=torch.tensor([9])).logits
    got = decode(**step, past_key_values=cache)
    assert (got.logits - want).abs().max().item() <= 1e-4
    for ours, eager in zip(cache.layers, twin.layers):
        assert (ours.keys - eager.keys).abs().max().item() <= 1e-5  # written in the caller's own tensors
        assert (ours.values - eager.values).abs().max().item() <= 1e-5
        assert int(ours.cumulative_length) == int(eager.cumulative_length) == 10


def test_explicit_dims_for_generation_leave_the_stages_own_inputs_dynamic():
    """export_for_generation with dynamic_shapes naming only input_ids: the cache and positions the decomposition
    makes get Dim.AUTO (a static cache list would fail in torch.export, a static growing cache at step 2), the decode
    step's single token stays static, generate() equals eager; a padded batch on this mask-less export is refused
    instead of silently attending to the pads; a name no stage and no sample input has is a ConfigError."""
    case = TINY_CASES["llama"]
    model = case.build()
    config = DynamoConfig(dynamic_shapes={"input_ids": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}})
    exported = DynamoExporter().export_for_generation(model, case.inputs(2, 6, padded=False), config)
    decode = {s.name: s.shape for s in exported.components["decode"].metadata.inputs}
    assert decode["input_ids"][1] == 1 and isinstance(decode["past_key_values.layers.0.keys"][2], str), decode
    prompt = case.inputs(3, 9, padded=False)
    with torch.no_grad():
        expected = model.generate(**prompt, max_new_tokens=8, do_sample=False)
    assert torch.equal(exported.generate(**prompt, max_new_tokens=8, do_sample=False), expected)
    with pytest.raises(UnsupportedError, match="prefill graph takes no attention mask"):
        exported.generate(**case.inputs(3, 9, padded=True), max_new_tokens=2, do_sample=False)
    with pytest.raises(ValueError, match="'input_idz' is neither a sample input"):
        DynamoExporter().export_for_generation(
            model, case.inputs(2, 6), DynamoConfig(dynamic_shapes={"input_idz": {0: torch.export.Dim.AUTO}})
        )
