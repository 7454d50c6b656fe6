"""The export flow's contract: inputs untouched, typed errors with context, kwargs handling, workarounds."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

from hfexport import DynamoConfig, DynamoExporter, ExportError, MissingPackageError, UnsupportedError
from hfexport.utils import get_leaf_tensors, prepare_for_export
from hfexport.workarounds import Workaround, applied_workarounds, register_workaround
from hfexport.workarounds import registry as wreg


def _llama(attn: str = "sdpa") -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, attn_implementation=attn,
    )
    return LlamaForCausalLM(config).eval()


def _inputs(batch: int = 2, seq: int = 6) -> dict:
    ids = torch.randint(3, 128, (batch, seq), generator=torch.Generator().manual_seed(batch * 100 + seq))
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def test_prepare_for_export_never_mutates_the_callers_dict_or_config():
    model = _llama()
    inputs = {**_inputs(), "labels": torch.zeros(2, 6, dtype=torch.long), "use_cache": False, "return_dict": True}
    before = dict(inputs)
    use_cache_before = model.config.use_cache
    _, new, flags = prepare_for_export(model, inputs)
    assert inputs == before and list(inputs) == list(before)
    assert "labels" not in new and "use_cache" not in new and "return_dict" not in new
    assert flags == {"use_cache": False, "return_dict": True}
    assert model.config.use_cache == use_cache_before


def test_prepare_casts_float_inputs_to_the_model_dtype_and_copies_caches():
    model = _llama().to(torch.float64)
    cache = StaticCache(config=model.config, max_cache_len=16)
    inputs = {"inputs_embeds": torch.randn(1, 3, 64), "past_key_values": cache}
    _, new, _ = prepare_for_export(model, inputs)
    assert new["inputs_embeds"].dtype == torch.float64
    assert inputs["inputs_embeds"].dtype == torch.float32
    assert new["past_key_values"] is not cache


def test_export_leaves_model_and_inputs_unchanged():
    model = _llama()
    inputs = {**_inputs(), "use_cache": True}
    state = copy.deepcopy(model.state_dict())
    snapshot = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    DynamoExporter().export(model, inputs, config=DynamoConfig(dynamic=True))
    assert list(inputs) == list(snapshot)
    for key, value in snapshot.items():
        assert torch.equal(inputs[key], value) if isinstance(value, torch.Tensor) else inputs[key] == value
    for key, value in model.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert model.training is False


@pytest.mark.parametrize("impl", ["flash_attention_2", "flex_attention"])
def test_unexportable_attention_is_refused_before_tracing(impl, monkeypatch):
    model = _llama()
    monkeypatch.setattr(model.config, "_attn_implementation", impl, raising=False)
    called = []
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: called.append(1))
    with pytest.raises(UnsupportedError, match="sdpa") as info:
        DynamoExporter().export(model, _inputs(), config=DynamoConfig())
    assert impl in str(info.value)
    assert not called, "torch.export must not run"


def test_trace_failure_names_component_submodule_inputs_and_hint(monkeypatch):
    # (the fallback that traces the sample's branch is tested in test_data_dependent_trace; here it fails)
    from hfexport.capture import trace

    traced = trace._export

    def without_fallback(*args):
        if torch._functorch.config.fake_tensor_propagate_real_tensors:
            raise RuntimeError("the fallback fails too")
        return traced(*args)

    monkeypatch.setattr(trace, "_export", without_fallback)

    class Branchy(torch.nn.Module):
        def forward(self, x):
            if x.sum() > 0:  # data-dependent control flow
                return x * 2
            return x

    with pytest.raises(ExportError) as info:
        DynamoExporter().export(Branchy(), {"x": torch.ones(2, 3)}, config=DynamoConfig())
    err = info.value
    assert err.component == "model" and err.submodule == "Branchy" and err.input_keys == ["x"]
    assert "data-dependent" in (err.hint or "")
    assert "Branchy" in str(err) and "x" in str(err)
    assert err.stage == "trace" and "during trace" in str(err)


def test_a_failure_while_lowering_names_the_lower_stage_and_the_component(monkeypatch):
    pytest.importorskip("onnxscript", reason="the ONNX backend's packages are not installed")
    from hfexport import OnnxConfig, OnnxExporter
    from hfexport.backends.onnx import exporter as onnx_exporter

    def broken(program, opset):
        raise RuntimeError("converter exploded")

    monkeypatch.setattr(onnx_exporter, "to_onnx", broken)
    with pytest.raises(ExportError) as info:
        OnnxExporter().export(_llama(), _inputs(), config=OnnxConfig())
    assert info.value.stage == "lower" and info.value.component == "model"
    assert "converter exploded" in str(info.value) and info.value.submodule == "LlamaForCausalLM"


def test_each_stage_is_timed_per_component_in_order():
    exporter = DynamoExporter()
    exporter.export_for_generation(_llama(), _inputs(batch=1), DynamoConfig(dynamic=True))
    stages = [(t.component, t.stage) for t in exporter.stage_timings]
    per_graph = ["check", "prepare", "trace", "signature", "lower", "finish"]
    assert stages[:2] == [("generate", "capture"), ("generate", "calibrate")]
    assert stages[2:] == [("decode", s) for s in per_graph] + [("prefill", s) for s in per_graph]
    assert all(t.seconds >= 0 for t in exporter.stage_timings)
    trace = sum(t.seconds for t in exporter.stage_timings if t.stage == "trace")
    assert trace > 0.05, "torch.export of two Llama layers takes more than 50 ms"


def test_missing_backend_package_names_the_pip_line(monkeypatch):
    import importlib.metadata as md

    class NeedsPkg(DynamoExporter):
        required_packages = {"surely-not-installed-pkg": "1.0"}
        package_extra = "onnx"

    real = md.version
    monkeypatch.setattr(md, "version", lambda name: (_ for _ in ()).throw(md.PackageNotFoundError(name))
                        if name == "surely-not-installed-pkg" else real(name))
    with pytest.raises(MissingPackageError) as info:
        NeedsPkg().export(_llama(), _inputs(), config=DynamoConfig())
    assert "pip install" in info.value.pip_line and "hfexport[onnx]" in info.value.pip_line
    assert isinstance(info.value, ImportError)


def test_too_old_package_and_drift_warning(monkeypatch):
    import importlib.metadata as md

    real = md.version

    class NeedsNew(DynamoExporter):
        required_packages = {"torch": "99.0"}

    with pytest.raises(MissingPackageError, match="needs >= 99.0"):
        NeedsNew().validate_environment()

    monkeypatch.setattr(md, "version", lambda name: "5.0.0" if name == "transformers" else real(name))
    from hfexport import _versions

    monkeypatch.setattr(_versions, "_drift_warned", set())
    with pytest.warns(UserWarning, match="tested with transformers=="):
        DynamoExporter().validate_environment()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        DynamoExporter().validate_environment()  # warned once only


def test_call_drops_untraced_kwargs_with_one_warning_and_refuses_missing_ones():
    model = _llama()
    exported = DynamoExporter().export(model, _inputs(), config=DynamoConfig(dynamic=True))
    extra = {**_inputs(1, 4), "token_type_ids": torch.zeros(1, 4, dtype=torch.long)}
    with pytest.warns(UserWarning, match="token_type_ids"):
        out = exported(**extra)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exported(**extra)
    with torch.no_grad():
        ref = model(**_inputs(1, 4))
    assert (out.logits - ref.logits).abs().max() <= 1e-4
    with pytest.raises(UnsupportedError, match="attention_mask"):
        exported(input_ids=_inputs()["input_ids"])


def test_call_casts_an_int32_mask_like_a_tokenizer_might_give():
    model = _llama()
    exported = DynamoExporter().export(model, _inputs(), config=DynamoConfig(dynamic=True))
    inputs = _inputs(1, 5)
    out = exported(input_ids=inputs["input_ids"].int(), attention_mask=inputs["attention_mask"].int())
    with torch.no_grad():
        assert (out.logits - model(**inputs).logits).abs().max() <= 1e-4


def test_output_flag_traced_off_is_recorded_and_enforced():
    model = _llama()
    exported = DynamoExporter().export(model, {**_inputs(), "use_cache": False}, config=DynamoConfig(dynamic=True))
    metadata = exported.components["model"].metadata
    assert metadata.in_constants["use_cache"] is False
    assert exported(**_inputs()).past_key_values is None
    exported(**_inputs(), use_cache=False)
    with pytest.raises(UnsupportedError, match="use_cache"):
        exported(**_inputs(), use_cache=True)


def test_static_cache_input_is_mutated_in_place_like_eager():
    model = _llama()
    cache = StaticCache(config=model.config, max_cache_len=12)
    prompt = _inputs(1, 4)
    inputs = {
        "input_ids": prompt["input_ids"],
        "attention_mask": torch.ones(1, 1, 4, 12, dtype=torch.bool).tril(diagonal=0),
        "position_ids": torch.arange(4)[None],
        "past_key_values": cache,
    }
    inputs["attention_mask"] = (torch.arange(12)[None, :] <= torch.arange(4)[:, None])[None, None]
    with torch.no_grad():
        cache.early_initialization(1, 2, 16, torch.float32, torch.device("cpu"))
    exported = DynamoExporter().export(model, inputs, config=DynamoConfig())
    metadata = exported.components["model"].metadata
    mutated = [s.name for s in metadata.inputs if s.mutated]
    assert "past_key_values.layers.0.keys" in mutated and "past_key_values.layers.0.cumulative_length" in mutated

    eager_cache = StaticCache(config=model.config, max_cache_len=12)
    eager_cache.early_initialization(1, 2, 16, torch.float32, torch.device("cpu"))
    run_cache = StaticCache(config=model.config, max_cache_len=12)
    run_cache.early_initialization(1, 2, 16, torch.float32, torch.device("cpu"))
    with torch.no_grad():
        ref = model(**{**inputs, "past_key_values": eager_cache})
    out = exported(**{**inputs, "past_key_values": run_cache})
    assert (out.logits - ref.logits).abs().max() <= 1e-4
    assert int(run_cache.layers[0].cumulative_length) == 4
    assert torch.allclose(run_cache.layers[1].keys, eager_cache.layers[1].keys, atol=1e-5)
    untouched = StaticCache(config=model.config, max_cache_len=12)
    untouched.early_initialization(1, 2, 16, torch.float32, torch.device("cpu"))
    exported(share_inputs=False, **{**inputs, "past_key_values": untouched})
    assert int(untouched.layers[0].cumulative_length) == 0 and not untouched.layers[0].keys.any()


def test_get_leaf_tensors_names_nested_and_cache_leaves():
    model = _llama()
    with torch.no_grad():
        out = model(**_inputs())
    leaves = get_leaf_tensors(out)
    assert "logits" in leaves and "past_key_values.layers.1.values" in leaves
    assert leaves["logits"] is out.logits
    assert set(get_leaf_tensors({"a": [torch.ones(1), {"b": torch.zeros(1)}]})) == {"a.0", "a.1.b"}


def test_workarounds_apply_reversibly_and_are_recorded(monkeypatch):
    monkeypatch.setattr(wreg, "_registry", dict(wreg._registry))
    target = {"value": "original"}

    def apply(model, inputs):
        target["value"] = "patched"
        return lambda: target.update(value="original")

    register_workaround(Workaround(id="test/patch", backend="dynamo", target="test", breaks="nothing", apply=apply))
    register_workaround(
        Workaround(id="test/out-of-range", backend="dynamo", target="test", breaks="nothing",
                   versions={"torch": "<1.0"}, apply=lambda m, i: (_ for _ in ()).throw(AssertionError("ran")))
    )
    register_workaround(
        Workaround(id="test/other-backend", backend="onnx", target="test", breaks="nothing",
                   apply=lambda m, i: (_ for _ in ()).throw(AssertionError("ran")))
    )
    with pytest.raises(ValueError, match="already registered"):
        register_workaround(Workaround(id="test/patch", backend="dynamo", target="t", breaks="b", apply=apply))
    with pytest.raises(RuntimeError), applied_workarounds("dynamo", None, {}) as fired:
        # (of this test's three: the built-in ones for every backend, torch-real-tensor-offsets, fire too)
        assert [f for f in fired if f.startswith("test/")] == ["test/patch"] and target["value"] == "patched"
        raise RuntimeError("trace failed")
    assert target["value"] == "original"

    exported = DynamoExporter().export(_llama(), _inputs(), config=DynamoConfig())
    assert "test/patch" in exported.components["model"].metadata.workarounds
    assert "test/out-of-range" not in exported.components["model"].metadata.workarounds
    assert target["value"] == "original"


@pytest.mark.parametrize("calibrated", [False, True])
def test_a_quantizer_is_checked_once_per_export_for_generation(calibrated):
    from hfexport import ExportFormat
    from hfexport.quantizers.base import ExportQuantizer

    checks, quantized = [], []

    class Counting(ExportQuantizer):
        supported_formats = (ExportFormat.DYNAMO,)
        quantizes_fx_graph = True

        def validate_environment(self, export_format):
            checks.append(str(export_format))
            super().validate_environment(export_format)

        def quantize(self, model, sample_inputs, export_format):
            quantized.append(1)
            return model

    calibration = [_inputs(batch=1)] if calibrated else None
    DynamoExporter().export_for_generation(
        _llama(), _inputs(batch=1), DynamoConfig(dynamic=True, quantizer=Counting(calibration)))
    assert len(quantized) == 2, "the prefill and decode graphs are each quantized"
    assert checks == ["dynamo"]


def test_a_cache_only_generation_config_is_merged_into_the_models_own():
    from transformers import GenerationConfig

    model = _llama()
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = 7, 0
    cache_only = GenerationConfig(cache_implementation="static", max_cache_len=32)
    assert cache_only.eos_token_id is None  # what was saved before: the model's ids lost
    exported = DynamoExporter().export_for_generation(
        model, _inputs(batch=1), DynamoConfig(dynamic=True), generation_config=cache_only, multi_token_decode=True)
    saved = exported.generation_config
    assert (saved.cache_implementation, saved.max_cache_len) == ("static", 32)
    assert (saved.eos_token_id, saved.pad_token_id) == (7, 0)
    assert model.generation_config.cache_implementation is None, "the model's own config is left as it was"
    assert exported.components["decode"].metadata.cache_type == "StaticCache"


def test_image_sizes_are_traced_as_the_samples_values_and_other_values_are_refused_by_name():
    """Mistral 3's Pixtral tower and patch merger size their tensors from image_sizes in Python: traced as a tensor,
    torch.export stopped on a data-dependent guard ('u1*u3 + u5*u7 > 1'). As a constant list the export runs, like
    eager, on the same sizes (a tensor, or a list of tuples), and refuses others."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    model = build_model("mistral3", "Mistral3ForConditionalGeneration")
    inputs = sample_inputs(model, "mistral3")
    assert isinstance(inputs["image_sizes"], torch.Tensor)
    exported = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
    metadata = exported.components["model"].metadata
    assert metadata.in_constants["image_sizes.1.0"] == int(inputs["image_sizes"][1, 0])
    with torch.no_grad():
        want = model(**inputs).logits
    sizes = inputs["image_sizes"]
    for given in (sizes, [tuple(row) for row in sizes.tolist()]):
        assert (exported(**{**inputs, "image_sizes": given}).logits - want).abs().max() <= 1e-4
    other = sizes.clone()
    other[0, 1] //= 2
    with pytest.raises(UnsupportedError, match="'image_sizes'=.*differs from the values this export was specialised"):
        exported(**{**inputs, "image_sizes": other})
