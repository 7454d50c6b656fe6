"""Quantizer API: which formats each serves (ValueError before any tracing), package checks, calibration sets,
library-argument configs, recipes and the CLI's --quantize / --calibration."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

import hfexport
from hfexport import (
    AotiConfig,
    CalibrationSet,
    DynamoConfig,
    ExecutorchConfig,
    ExportFormat,
    ExportQuantizer,
    MissingPackageError,
    NNCFOnnxQuantizer,
    NNCFOpenVINOQuantizer,
    NNCFQuantizationConfig,
    NNCFTorchFXQuantizer,
    NNCFWeightCompressionConfig,
    OnnxConfig,
    OnnxRuntimeDynamicConfig,
    OnnxRuntimeQuantizer,
    OnnxRuntimeStaticConfig,
    OpenVINOConfig,
    PT2EQuantizer,
)
from hfexport.testing.tiny import TINY_CASES
from hfexport.quantizers.presets import RECIPES, read_prompts, recipe

CONFIGS = {
    ExportFormat.DYNAMO: DynamoConfig,
    ExportFormat.ONNX: OnnxConfig,
    ExportFormat.EXECUTORCH: ExecutorchConfig,
    ExportFormat.OPENVINO: OpenVINOConfig,
    ExportFormat.AOTI: AotiConfig,
}
# no quantizer serves AOTInductor packages yet (an X86InductorQuantizer graph through the frozen GEMM template is
# untested): each refuses it before tracing, like any format it does not serve
_QUANTIZABLE = set(ExportFormat) - {ExportFormat.AOTI}


class _AnyAnnotator:
    """Stands in for a torchao PT2E quantizer: PT2EQuantizer only needs ``annotate`` to be there."""

    def annotate(self, model):
        return model

    def validate(self, model):
        pass


def _quantizers():
    return {
        "PT2EQuantizer": PT2EQuantizer(_AnyAnnotator()),
        "OnnxRuntimeQuantizer": OnnxRuntimeQuantizer(),
        "NNCFOpenVINOQuantizer": NNCFOpenVINOQuantizer(),
        "NNCFOnnxQuantizer": NNCFOnnxQuantizer(),
        "NNCFTorchFXQuantizer": NNCFTorchFXQuantizer(),
    }


SUPPORTED = {
    "PT2EQuantizer": _QUANTIZABLE,
    "OnnxRuntimeQuantizer": {ExportFormat.ONNX},
    "NNCFOpenVINOQuantizer": {ExportFormat.OPENVINO},
    "NNCFOnnxQuantizer": {ExportFormat.ONNX},
    # nncf.quantize's quantize/dequantize ops do not lower to ExecuTorch (checked separately, weight-only does)
    "NNCFTorchFXQuantizer": {ExportFormat.DYNAMO, ExportFormat.ONNX, ExportFormat.OPENVINO},
}
UNSUPPORTED = [(q, f) for q in SUPPORTED for f in ExportFormat if f not in SUPPORTED[q]]


@pytest.fixture
def no_tracing(monkeypatch):
    """Fail the test if anything reaches torch.export or generate()."""
    calls = []

    def refuse(*args, **kwargs):
        calls.append("trace")
        raise AssertionError("torch.export.export was called")

    monkeypatch.setattr(torch.export, "export", refuse)
    return calls


@pytest.mark.parametrize("name,fmt", UNSUPPORTED, ids=[f"{q}-{f.value}" for q, f in UNSUPPORTED])
def test_unsupported_pair_raises_value_error_before_tracing(name, fmt, no_tracing):
    quantizer = _quantizers()[name]
    case = TINY_CASES["llama"]
    model = case.build()
    config = CONFIGS[fmt](quantizer=quantizer)
    exporter = hfexport.AutoHfExporter.from_config(config)
    message = f"{name} cannot quantize a '{fmt.value}' export|{name} with NNCFQuantizationConfig cannot serve"
    with pytest.raises(ValueError, match=message):
        exporter.export(model, case.inputs(1, 5), config)
    # export_for_generation says so before it even runs generate() to capture the components
    model.generate = lambda *a, **k: pytest.fail("generate() ran before the quantizer was checked")
    with pytest.raises(ValueError, match=message):
        exporter.export_for_generation(model, case.inputs(1, 5), config)
    assert no_tracing == []


def test_nncf_fx_quantization_on_executorch_is_refused_weight_compression_is_not():
    with pytest.raises(ValueError, match="XNNPACK does not delegate"):
        NNCFTorchFXQuantizer(NNCFQuantizationConfig()).validate_environment("executorch")
    NNCFTorchFXQuantizer(NNCFWeightCompressionConfig()).validate_environment("executorch")
    NNCFTorchFXQuantizer(NNCFWeightCompressionConfig(mode="int8_sym")).validate_environment("executorch")
    # 4-bit: NNCF unpacks it with aten.bitwise_right_shift, which ExecuTorch's to_edge refuses (not core ATen)
    with pytest.raises(ValueError, match="4-bit weight compression.*bitwise_right_shift"):
        NNCFTorchFXQuantizer(NNCFWeightCompressionConfig(mode="int4_sym")).validate_environment("executorch")
    NNCFTorchFXQuantizer(NNCFWeightCompressionConfig(mode="int4_sym")).validate_environment("dynamo")


@pytest.mark.parametrize("option", ["gptq", "lora_correction"])
@pytest.mark.parametrize("cls,fmt", [(NNCFOnnxQuantizer, "onnx"), (NNCFTorchFXQuantizer, "dynamo")])
def test_openvino_only_compression_options_are_refused_elsewhere(cls, fmt, option):
    config = NNCFWeightCompressionConfig(mode="int4_sym", **{option: True})
    with pytest.raises(ValueError, match=f"{option}.*OpenVINO models only"):
        cls(config).validate_environment(fmt)
    NNCFOpenVINOQuantizer(config).validate_environment("openvino")


def test_supported_formats_are_declared_as_the_spec_says():
    for name, quantizer in _quantizers().items():
        served = {f for f in ExportFormat if f in quantizer.supported_formats}
        expected = SUPPORTED[name] | ({ExportFormat.EXECUTORCH} if name == "NNCFTorchFXQuantizer" else set())
        assert served == expected, name
    assert PT2EQuantizer.quantizes_fx_graph and NNCFTorchFXQuantizer.quantizes_fx_graph
    assert not (OnnxRuntimeQuantizer.quantizes_fx_graph or NNCFOnnxQuantizer.quantizes_fx_graph
                or NNCFOpenVINOQuantizer.quantizes_fx_graph)


class _Needs(ExportQuantizer):
    supported_formats = (ExportFormat.DYNAMO,)


def test_missing_package_names_the_pip_line():
    class NeedsMissing(_Needs):
        required_packages = {"surely-not-installed-pkg": ""}

    with pytest.raises(MissingPackageError) as info:
        NeedsMissing().validate_environment("dynamo")
    assert info.value.package == "surely-not-installed-pkg"
    assert "pip install" in str(info.value) and "hfexport[quantization]" in str(info.value)


def test_too_old_package_is_missing_with_found_and_minimum():
    class NeedsFutureTorch(_Needs):
        required_packages = {"torch": "99.0"}

    with pytest.raises(MissingPackageError, match=r"torch 2\.\d+.* needs >= 99.0") as info:
        NeedsFutureTorch().validate_environment("dynamo")
    assert info.value.minimum == "99.0" and info.value.found.startswith("2.")


def test_tested_versions_come_from_the_pins():
    assert NNCFOnnxQuantizer().tested_versions["nncf"] == "3.4.0"
    assert PT2EQuantizer(_AnyAnnotator()).tested_versions == {"torchao": "0.18.0"}


def test_a_pt2e_quantizer_must_be_a_pt2e_annotator():
    with pytest.raises(TypeError, match="torchao PT2E Quantizer"):
        PT2EQuantizer(object())


# --- calibration ---------------------------------------------------------------------------------------------------


def test_calibration_set_is_lazy_and_reiterable():
    seen = []

    def transform(sample):
        seen.append(sample["i"])
        return sample["i"] * 10

    calib = CalibrationSet([{"i": 1}, {"i": 2}], {"i": 0}, transform)
    assert seen == []  # nothing read yet
    first = iter(calib)
    assert next(first) == 10 and seen == [1]  # one sample at a time
    assert list(calib) == [10, 20] and list(calib) == [10, 20]


def test_calibration_set_reads_a_generator_factory_lazily_each_pass():
    class Samples:
        passes = 0

        def __iter__(self):
            Samples.passes += 1
            yield from ({"x": torch.full((1,), float(i))} for i in range(3))

    calib = CalibrationSet(Samples(), {}, lambda s: float(s["x"]))
    assert list(calib) == [0.0, 1.0, 2.0] and list(calib) == [0.0, 1.0, 2.0] and Samples.passes == 2


def test_calibration_falls_back_to_sample_inputs_with_one_warning():
    calib = CalibrationSet(None, {"input_ids": torch.ones(1, 3)}, lambda s: s["input_ids"].sum().item())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert list(calib) == [3.0] and list(calib) == [3.0]
    assert len([w for w in caught if "calibration_dataset" in str(w.message)]) == 1


def test_with_calibration_is_a_copy():
    quantizer = OnnxRuntimeQuantizer(OnnxRuntimeStaticConfig(per_channel=True))
    samples = [{"input_ids": torch.ones(1, 2, dtype=torch.long)}]
    other = quantizer.with_calibration(samples)
    assert other is not quantizer and other.calibration_dataset is samples and quantizer.calibration_dataset is None
    assert other.config is quantizer.config and isinstance(other, OnnxRuntimeQuantizer)


def test_traced_calibration_keeps_traced_keys_and_copies_caches():
    from transformers import DynamicCache

    cache = DynamicCache()
    cache.update(torch.ones(1, 1, 2, 4), torch.ones(1, 1, 2, 4), 0)
    sample = {"input_ids": torch.ones(1, 1, dtype=torch.long), "past_key_values": cache, "use_cache": True}
    quantizer = NNCFTorchFXQuantizer(calibration_dataset=[sample])
    (got,) = list(quantizer.traced_calibration(sample))
    assert list(got) == ["input_ids", "past_key_values"]  # the output flag is not a traced input
    got["past_key_values"].update(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), 0)
    assert cache.get_seq_length() == 2  # the caller's cache is untouched by a calibration forward
    bad = NNCFTorchFXQuantizer(calibration_dataset=[{"attention_mask": torch.ones(1, 1)}])
    with pytest.raises(ValueError, match=r"lacks the traced inputs \['input_ids', 'past_key_values'\]"):
        list(bad.traced_calibration(sample))


def test_flat_feeds_follow_the_graph_inputs_and_dtypes():
    from transformers import DynamicCache

    from hfexport.quantizers.calibration import flat_feeds

    cache = DynamicCache()
    cache.update(torch.ones(1, 1, 2, 4), 2 * torch.ones(1, 1, 2, 4), 0)
    sample = {"input_ids": torch.ones(1, 1, dtype=torch.long), "past_key_values": cache}
    names = ["input_ids", "input.past_key_values.layers.0.keys", "input.past_key_values.layers.0.values"]
    feeds = flat_feeds(sample, ["input_ids", "past_key_values"], names, ["int64", "float16", "float32"])
    assert list(feeds) == names
    assert feeds[names[1]].dtype.name == "float16" and feeds[names[2]].max() == 2.0
    with pytest.raises(ValueError, match="flattens to 3 tensors but the converted graph takes 2"):
        flat_feeds(sample, ["input_ids", "past_key_values"], names[:2], ["int64", "float32"])


# --- library arguments -----------------------------------------------------------------------------------------------


def test_a_field_left_none_keeps_the_library_default():
    assert OnnxRuntimeStaticConfig().to_kwargs() == {}
    assert OnnxRuntimeStaticConfig(per_channel=True).to_kwargs() == {"per_channel": True}
    assert OnnxRuntimeDynamicConfig(reduce_range=False).to_kwargs() == {"reduce_range": False}
    assert NNCFWeightCompressionConfig(group_size=64, awq=True).to_kwargs() == {"group_size": 64, "awq": True}
    assert isinstance(OnnxRuntimeQuantizer().config, OnnxRuntimeStaticConfig)  # static is the default
    assert isinstance(NNCFOnnxQuantizer().config, NNCFQuantizationConfig)


def test_nncf_quantize_defaults_model_type_to_transformer(monkeypatch):
    import nncf

    seen = {}
    monkeypatch.setattr(nncf, "quantize", lambda model, dataset, **kw: seen.update(kw, data=list(dataset.get_inference_data())) or model)
    monkeypatch.setattr(nncf, "compress_weights", lambda model, dataset=None, **kw: seen.update(kw, data=dataset))
    quantizer = NNCFOpenVINOQuantizer(NNCFQuantizationConfig(subset_size=2), calibration_dataset=[{"x": 1}])
    quantizer._run("model", CalibrationSet([{"x": 1}, {"x": 2}], {}, lambda s: s["x"]))
    assert seen == {"model_type": nncf.ModelType.TRANSFORMER, "subset_size": 2, "data": [1, 2]}
    seen.clear()
    explicit = NNCFOpenVINOQuantizer(NNCFQuantizationConfig(model_type="other"))
    explicit._run("model", CalibrationSet([{"x": 1}], {}, lambda s: s["x"]))
    assert seen["model_type"] == "other"
    seen.clear()  # int8 weight compression is data-free: NNCF gets no dataset
    NNCFOpenVINOQuantizer(NNCFWeightCompressionConfig())._run("model", CalibrationSet([{"x": 1}], {}, dict))
    assert seen == {"data": None}
    seen.clear()
    int4 = NNCFWeightCompressionConfig(mode=nncf.CompressWeightsMode.INT4_SYM, awq=True)
    NNCFOpenVINOQuantizer(int4)._run("model", CalibrationSet([{"x": 1}], {}, lambda s: s["x"]))
    assert seen["awq"] is True and seen["data"] is not None


def test_configs_describe_their_quantizer_in_the_saved_config():
    config = OnnxConfig(quantizer=OnnxRuntimeQuantizer(OnnxRuntimeDynamicConfig(per_channel=True)))
    described = json.loads(config.to_json_string())["quantizer"]
    assert described["type"] == "OnnxRuntimeQuantizer"
    assert described["config"] == {"type": "OnnxRuntimeDynamicConfig", "per_channel": "True"}


# --- recipes and the CLI ---------------------------------------------------------------------------------------------


def test_the_cli_offers_every_recipe():
    from hfexport.cli.export import RECIPES as CLI_RECIPES

    assert CLI_RECIPES == RECIPES


@pytest.mark.parametrize("name", RECIPES)
def test_each_recipe_serves_its_formats_and_refuses_the_others(name):
    serves = {
        "pt2e-int8": _QUANTIZABLE,
        "ort-dynamic": {ExportFormat.ONNX},
        "ort-static": {ExportFormat.ONNX},
        "ort-int8": {ExportFormat.ONNX},
        "ort-int4": {ExportFormat.ONNX},
        "nncf-int8": _QUANTIZABLE,
        "nncf-int8-weights": _QUANTIZABLE,
        "nncf-int4": _QUANTIZABLE - {ExportFormat.EXECUTORCH},  # 4-bit unpacking is not core ATen
        "torchao-8da4w": {ExportFormat.EXECUTORCH},  # tests/test_quantizer_torchao.py
        "hqq-int4": {ExportFormat.OPENVINO},  # float zero points: off MatMulNBits' fast kernels (test_openvino_groups)
        "int8-groups": {ExportFormat.OPENVINO},
    }[name]
    for fmt in ExportFormat:
        if fmt in serves:
            quantizer = recipe(name, fmt)
            assert fmt in quantizer.supported_formats
        else:
            with pytest.raises(ValueError, match="cannot quantize|cannot serve"):
                recipe(name, fmt)
    assert isinstance(recipe("nncf-int8", "executorch").config, NNCFWeightCompressionConfig)
    assert isinstance(recipe("nncf-int8", "openvino"), NNCFOpenVINOQuantizer)



LLAMA_PATHS = ["model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.v_proj",
               "model.layers.0.self_attn.o_proj", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
               "model.layers.0.mlp.down_proj", "lm_head"]


def _weight_only(patterns):
    import re

    return [path.rsplit(".", 1)[-1] for path in LLAMA_PATHS if any(re.search(p, path) for p in patterns)]


def test_int8_recipes_keep_float_activations_on_the_norm_fed_layers():
    """The per-layer choices measured on SmolLM2 (benchmarks/RESULTS_QUANTIZED.md): static activations stay on
    o_proj only for ORT static and dynamic, PT2E (whose X86 quantizer takes the linears only, not every mul) and
    NNCF on ONNX and OpenVINO (with SmoothQuant at 0.5): scored through the static-cache decode loop, NNCF with only
    down_proj float kept 83.6 % (OpenVINO) and 87.1 % (ONNX) of SmolLM2's greedy tokens."""
    from hfexport.quantizers.pt2e_weights import WeightOnlyInt8Quantizer

    norm_fed = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    assert _weight_only(recipe("ort-static", "onnx").weight_only_modules) == norm_fed
    assert _weight_only(recipe("ort-dynamic", "onnx").weight_only_modules) == norm_fed
    pt2e = recipe("pt2e-int8", "openvino").quantizer
    annotator = next(q for q in pt2e.quantizers if isinstance(q, WeightOnlyInt8Quantizer))
    assert _weight_only([p.pattern for p in annotator.modules]) == norm_fed
    x86 = next(q for q in pt2e.quantizers if not isinstance(q, WeightOnlyInt8Quantizer))
    assert x86.global_config is None and list(x86.operator_type_qconfig) == [torch.ops.aten.linear.default]  # no mul
    for fmt in ("onnx", "openvino"):
        nncf_int8 = recipe("nncf-int8", fmt)
        assert [m for m in _weight_only(nncf_int8.weight_only_modules) if m != "embed_tokens"] == norm_fed
        assert nncf_int8.config.advanced_parameters.smooth_quant_alphas.matmul == 0.5

def test_read_prompts_takes_strings_and_text_objects(tmp_path):
    path = tmp_path / "calib.jsonl"
    path.write_text('"Hello there"\n\n{"text": "The sky is"}\n{"prompt": "Once"}\n', encoding="utf-8")
    assert read_prompts(path) == ["Hello there", "The sky is", "Once"]
    path.write_text('"ok"\n{"other": 1}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"calib.jsonl:2: expected a JSON string"):
        read_prompts(path)


def test_cli_refuses_an_unsupported_quantize_format_pair_before_loading(tmp_path):
    src = str(Path(__file__).resolve().parents[1] / "src")
    done = subprocess.run(
        [sys.executable, "-m", "hfexport.cli", "export", str(tmp_path / "no-model"), "--format", "openvino",
         "--output", str(tmp_path / "out"), "--quantize", "ort-dynamic"],
        capture_output=True, text=True, env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"}, timeout=300,
    )
    assert done.returncode != 0
    assert "OnnxRuntimeQuantizer cannot quantize a 'openvino' export" in done.stderr, done.stderr[-2000:]
    assert "[load]" not in done.stderr  # refused before the model loads


# --- calibration for export_for_generation ---------------------------------------------------------------------------


class _Recording(ExportQuantizer):
    """An FX-graph quantizer that changes nothing and records the calibration samples it is given."""

    supported_formats = (ExportFormat.DYNAMO,)
    quantizes_fx_graph = True
    seen: list = []

    def quantize(self, model, sample_inputs, export_format):
        type(self).seen.append(list(self.traced_calibration(sample_inputs)))
        return model


def test_generate_kwargs_are_captured_into_one_calibration_set_per_component():
    from hfexport.exporter_dynamo import DynamoExporter

    case = TINY_CASES["llama"]
    model = case.build()
    samples = [case.inputs(1, 5, padded=False), case.inputs(1, 7, padded=False)]
    quantizer = _Recording(calibration_dataset=samples)
    _Recording.seen = []
    exported = DynamoExporter().export_for_generation(
        model, case.inputs(1, 6, padded=False), DynamoConfig(dynamic=True, quantizer=quantizer)
    )
    assert quantizer.calibration_dataset is samples  # the caller's quantizer is not changed
    assert set(exported.components) == {"prefill", "decode"}
    by_kind = {("past_key_values" in s[0] and s[0]["input_ids"].shape[1] == 1): s for s in _Recording.seen}
    decode, prefill = by_kind[True], by_kind[False]
    assert [s["input_ids"].shape[1] for s in prefill] == [5, 7]  # each prompt's own prefill forward
    assert [s["past_key_values"].get_seq_length() for s in decode] == [5, 7]  # its first decode step, after it
    for sample, calibration in zip(samples, prefill):
        assert torch.equal(calibration["input_ids"], sample["input_ids"])



def test_a_static_multi_token_decode_calibrates_on_the_prompt_as_the_runner_feeds_it():
    """Over a static cache, generate() gives the first forward no mask and a lazily allocated cache; the decode
    graph that also serves the prompt is fed a 4D causal mask over the cache slots and an allocated cache: its
    calibration sample for the prompt has the decode's inputs, the causal mask, and an empty allocated cache."""
    import copy

    import torch.utils._pytree as pytree

    from hfexport.pytrees import register_cache_classes
    from hfexport.quantizers.calibration import capture_calibration

    case = TINY_CASES["llama"]
    model = case.build()
    generation = copy.deepcopy(model.generation_config)
    generation.cache_implementation, generation.max_cache_len = "static", 32
    captured = capture_calibration(model, [case.inputs(1, 9, padded=False)], generation, multi_token_decode=True)
    step, prompt = captured["decode"]
    assert prompt["input_ids"].shape == (1, 9) and step["input_ids"].shape == (1, 2)
    assert set(prompt) == set(step)
    mask = prompt["attention_mask"]
    assert mask.shape == (1, 1, 9, 32) and mask.dtype == step["attention_mask"].dtype
    attended = mask if mask.dtype == torch.bool else mask == 0
    assert torch.equal(attended[0, 0], torch.arange(32)[None, :] <= torch.arange(9)[:, None])
    register_cache_classes()
    leaves = [x for x in pytree.tree_leaves(prompt["past_key_values"]) if isinstance(x, torch.Tensor)]
    step_leaves = [x for x in pytree.tree_leaves(step["past_key_values"]) if isinstance(x, torch.Tensor)]
    assert [x.shape for x in leaves] == [x.shape for x in step_leaves]
    assert all(not x.any() for x in leaves) and any(x.any() for x in step_leaves)  # empty; the step's is written


def test_the_benchmark_scores_agreement_on_prompts_it_does_not_calibrate_on():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import bench_quantized

    assert len(bench_quantized.EVAL_PROMPTS) == 4
    bench_quantized.check_disjoint(bench_quantized.EVAL_PROMPTS, bench_quantized.CALIBRATION)
    leaked = bench_quantized.CALIBRATION[3][:150]
    with pytest.raises(ValueError, match="shares text with the calibration set"):
        bench_quantized.check_disjoint([*bench_quantized.EVAL_PROMPTS, leaked], bench_quantized.CALIBRATION)

def test_quantizer_workarounds_are_registered_and_undone():
    """The two upstream fixes quantizers need are registered workarounds, applied only around the library call
    (never by a trace: their ``applies`` wants the quantizer's model), and undone afterwards."""
    import onnx_ir as ir
    from onnxruntime.quantization.operators.attention import AttentionQuant

    from hfexport.quantizers.base import quantizer_workarounds
    from hfexport.workarounds import workarounds

    by_id = {w.id: w for w in workarounds()}
    ort, xnnpack = by_id["onnxruntime-quantize-standard-attention"], by_id["pt2e-xnnpack-integer-scalars"]
    assert (ort.backend, xnnpack.backend) == ("onnx", "executorch")
    assert ort.versions and xnnpack.versions and ort.breaks and xnnpack.breaks
    tiny = TINY_CASES["llama"].build()
    assert not ort.applies(tiny, {}) and not xnnpack.applies(tiny, {})  # a trace's model: not theirs

    class _Node:
        def __init__(self, domain):
            self.domain, self.op_type, self.name = domain, "Attention", "attention"

    class _Quantizer:
        def should_quantize_node(self, node):
            return True

    def should(domain):
        op = AttentionQuant.__new__(AttentionQuant)
        op.quantizer, op.node = _Quantizer(), _Node(domain)
        return op.should_quantize()

    original = AttentionQuant.should_quantize
    assert should("") and should("com.microsoft")  # ONNX Runtime alone would rewrite the standard op too
    with quantizer_workarounds([ort.id], ir.Model(ir.Graph([], [], nodes=[]), ir_version=10)) as fired:
        assert fired == [ort.id]
        assert not should("") and should("com.microsoft")
    assert AttentionQuant.should_quantize is original


def test_importing_the_nbits_quantizer_leaves_the_root_logger_alone():
    """onnxruntime's matmul_nbits_quantizer calls logging.basicConfig(level=INFO) at import (workaround
    onnxruntime-nbits-root-logging): imported through the workaround, the root logger keeps its level and handlers, and
    the quantizer's INFO lines are off while it runs."""
    import logging
    import sys

    from hfexport.workarounds import workarounds
    from hfexport.workarounds.quantize_ort_nbits_logging import MODULE, import_quietly

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    for handler in handlers:  # an application that configured nothing (pytest's own capture handlers set aside)
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    sys.modules.pop(MODULE, None)  # imported afresh: its basicConfig runs again
    try:
        import_quietly()
        assert (root.level, root.handlers) == (logging.WARNING, [])
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    (fix,) = [w for w in workarounds() if w.id == "onnxruntime-nbits-root-logging"]
    assert fix.in_version_range()
    undo = fix.apply(None, {})
    assert logging.getLogger(MODULE).getEffectiveLevel() >= logging.WARNING
    undo()


def test_configs_differing_only_in_calibration_samples_are_one_recipe():
    from hfexport.quantizers.calibration import same_recipe

    quantizer = recipe("nncf-int8-weights", "openvino")
    a = OpenVINOConfig(dynamic=True, quantizer=quantizer.with_calibration([{"input_ids": torch.ones(1, 3)}]))
    b = OpenVINOConfig(dynamic=True, quantizer=quantizer.with_calibration([{"input_ids": torch.ones(1, 5)}]))
    assert a != b and same_recipe(a, b)
    assert not same_recipe(a, OpenVINOConfig(dynamic=False, quantizer=quantizer))
    assert not same_recipe(a, OpenVINOConfig(dynamic=True, quantizer=recipe("nncf-int4", "openvino")))
    assert not same_recipe(a, OpenVINOConfig(dynamic=True))
