"""Export configs: fields and defaults as the spec lists them, JSON round trips, and validation that reports every
problem at once."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import hfexport
from hfexport import (
    AotiConfig,
    AutoExportConfig,
    AutoHfExporter,
    ConfigError,
    DynamoConfig,
    ExecutorchConfig,
    ExportConfigMixin,
    ExportFormat,
    OnnxConfig,
    OpenVINOConfig,
)

# --- the spec's fields and defaults --------------------------------------------------------------------------------

_BASE = [
    ("dynamic", False),
    ("strict", False),
    ("dynamic_shapes", None),
    ("prefer_deferred_runtime_asserts_over_guards", False),
    ("quantizer", None),
]
SPEC_FIELDS = {
    DynamoConfig: [("export_format", ExportFormat.DYNAMO), *_BASE],
    OnnxConfig: [
        ("export_format", ExportFormat.ONNX),
        *_BASE,
        ("opset_version", None),
        ("optimize", True),
        ("ort_fusions", None),
    ],
    ExecutorchConfig: [
        ("export_format", ExportFormat.EXECUTORCH),
        *_BASE,
        ("backend", "xnnpack"),
        ("alloc_graph_input", True),
        ("alloc_graph_output", True),
        ("alloc_mutable_buffers", True),
    ],
    OpenVINOConfig: [
        ("export_format", ExportFormat.OPENVINO),
        *_BASE,
        ("compress_to_fp16", False),
        ("stateful", True),
    ],
    # not in the spec: the AOTInductor backend's config (DESIGN 2.6), held to the same rules
    AotiConfig: [("export_format", ExportFormat.AOTI), *_BASE, ("gemm", "auto"), ("inductor_configs", None)],
}


def test_export_format_values():
    assert {f.name: f.value for f in ExportFormat} == {
        "DYNAMO": "dynamo",
        "ONNX": "onnx",
        "EXECUTORCH": "executorch",
        "OPENVINO": "openvino",
        "AOTI": "aoti",
    }
    assert ExportFormat("onnx") is ExportFormat.ONNX
    assert ExportFormat.ONNX == "onnx"  # a str enum: compares with the plain name
    assert str(ExportFormat.OPENVINO) == "openvino"


@pytest.mark.parametrize("cls", list(SPEC_FIELDS), ids=lambda c: c.__name__)
def test_fields_and_defaults_match_the_spec(cls):
    fields = dataclasses.fields(cls)
    assert [f.name for f in fields] == [name for name, _ in SPEC_FIELDS[cls]]
    defaults = {f.name: f.default for f in fields}
    for name, expected in SPEC_FIELDS[cls]:
        assert defaults[name] == expected, name
        assert type(defaults[name]) is type(expected), name
    instance = cls()
    assert isinstance(instance, ExportConfigMixin)
    assert {name: getattr(instance, name) for name, _ in SPEC_FIELDS[cls]} == dict(SPEC_FIELDS[cls])


@pytest.mark.parametrize("cls", [OnnxConfig, ExecutorchConfig, OpenVINOConfig, AotiConfig], ids=lambda c: c.__name__)
def test_backend_configs_inherit_dynamo_config(cls):
    assert issubclass(cls, DynamoConfig)


# --- round trips -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config",
    [
        DynamoConfig(dynamic=True, strict=True, prefer_deferred_runtime_asserts_over_guards=True),
        OnnxConfig(opset_version=20, optimize=True, ort_fusions="cuda"),
        OnnxConfig(optimize=False),
        ExecutorchConfig(backend="mlx", alloc_graph_input=False, alloc_graph_output=False, alloc_mutable_buffers=False),
        OpenVINOConfig(compress_to_fp16=True, stateful=False, dynamic=True),
        AotiConfig(dynamic=True, gemm="aten", inductor_configs={"max_autotune": True, "cpp.simdlen": 256}),
    ],
    ids=lambda c: type(c).__name__,
)
def test_to_dict_from_dict_round_trip(config):
    data = config.to_dict()
    assert data["export_format"] == str(config.export_format)
    assert isinstance(data["export_format"], str) and not isinstance(data["export_format"], ExportFormat)
    assert set(data) == {f.name for f in dataclasses.fields(config)}
    again = type(config).from_dict(data)
    assert again == config
    assert again.export_format is config.export_format  # parsed back to the enum, not left a str

    text = config.to_json_string()
    assert json.loads(text) == data
    assert type(config).from_dict(json.loads(text)) == config
    assert AutoExportConfig.from_dict(json.loads(text)) == config


def test_dynamic_shapes_with_dims_round_trip_through_json():
    batch = torch.export.Dim("batch", min=1, max=32)
    seq = torch.export.Dim("seq", min=2, max=512)
    config = DynamoConfig(
        dynamic_shapes={
            "input_ids": {0: batch, 1: seq},
            "attention_mask": {0: batch, 1: torch.export.Dim.AUTO},
            "position_ids": None,
        }
    )
    data = json.loads(config.to_json_string())
    assert data["dynamic_shapes"]["input_ids"] == {
        "__dims__": [[0, {"dim": "batch", "min": 1, "max": 32}], [1, {"dim": "seq", "min": 2, "max": 512}]]
    }
    assert data["dynamic_shapes"]["attention_mask"]["__dims__"][1] == [1, "auto"]

    reloaded = DynamoConfig.from_dict(data)
    shapes = reloaded.dynamic_shapes
    assert set(shapes) == {"input_ids", "attention_mask", "position_ids"}
    assert shapes["position_ids"] is None
    b0 = shapes["input_ids"][0]
    assert isinstance(b0, torch.export.Dim)
    assert (b0.__name__, b0.min, b0.max) == ("batch", 1, 32)
    s1 = shapes["input_ids"][1]
    assert (s1.__name__, s1.min, s1.max) == ("seq", 2, 512)
    # one Dim shared by two inputs stays one object (torch.export ties the two dims together through it)
    assert shapes["attention_mask"][0] is b0
    assert shapes["attention_mask"][1] is torch.export.Dim.AUTO
    # and the round trip is stable
    assert reloaded.to_dict() == config.to_dict()


def test_dim_without_max_and_hints_round_trip():
    seq = torch.export.Dim("seq")  # no bounds: max is int_oo, which must not reach the JSON
    config = DynamoConfig(
        dynamic_shapes={"x": {0: seq, 1: torch.export.Dim.STATIC, 2: torch.export.Dim.DYNAMIC}, "y": {0: 4}}
    )
    data = json.loads(config.to_json_string())
    assert data["dynamic_shapes"]["x"]["__dims__"] == [[0, {"dim": "seq", "min": 0}], [1, "static"], [2, "dynamic"]]
    shapes = DynamoConfig.from_dict(data).dynamic_shapes
    assert shapes["x"][0].__name__ == "seq" and shapes["x"][0].min == 0
    assert shapes["x"][1] is torch.export.Dim.STATIC
    assert shapes["x"][2] is torch.export.Dim.DYNAMIC
    assert shapes["y"] == {0: 4}


def test_bounded_dim_hint_round_trips():
    config = DynamoConfig(dynamic_shapes={"x": {0: torch.export.Dim.AUTO(min=2, max=9)}})
    data = json.loads(config.to_json_string())
    assert data["dynamic_shapes"]["x"]["__dims__"] == [[0, {"hint": "auto", "min": 2, "max": 9}]]
    hint = DynamoConfig.from_dict(data).dynamic_shapes["x"][0]
    assert hint == torch.export.Dim.AUTO(min=2, max=9)


def test_unsaveable_dims_are_refused_up_front():
    # an export records its config as JSON, so a spec that cannot be saved would only fail after tracing
    batch = torch.export.Dim("batch", min=1, max=32)
    with pytest.raises(ConfigError) as info:
        DynamoConfig(dynamic_shapes={"x": {0: 2 * batch}, "y": {0: "batch"}}, dynamic="no")
    problems = info.value.problems
    assert len(problems) == 2
    assert problems[0].startswith("dynamic:")
    assert problems[1].startswith("dynamic_shapes:") and "derived dim 2*batch" in problems[1]


# --- validation: one error, every problem ------------------------------------------------------------------------------


def test_config_error_is_a_value_error():
    assert issubclass(ConfigError, ValueError)
    assert issubclass(ConfigError, hfexport.HfExportError)


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        OnnxConfig.from_dict(
            {
                "export_format": "tflite",
                "dynamic": "yes",
                "colour": "blue",
                "optimize": False,
                "ort_fusions": "tpu",
                "opset_version": "18",
            }
        )
    error = info.value
    problems = error.problems
    assert len(problems) == 6, problems
    by_field = {p.split(":")[0].split("'")[1] if p.startswith("unknown") else p.split(":")[0]: p for p in problems}
    assert "colour" in by_field["colour"] and "allowed keys" in by_field["colour"]
    assert "dynamic_shapes" in by_field["colour"] and "ort_fusions" in by_field["colour"]  # names the allowed keys
    assert "'onnx'" in by_field["export_format"] and "'tflite'" in by_field["export_format"]
    assert "expected bool" in by_field["dynamic"] and "'yes'" in by_field["dynamic"]
    assert "expected int or None" in by_field["opset_version"]
    fusion_problems = [p for p in problems if p.startswith("ort_fusions")]
    assert len(fusion_problems) == 2
    assert any("'tpu'" in p and all(v in p for v in ("cpu", "cuda", "webgpu", "dml")) for p in fusion_problems)
    assert any("optimize=True" in p for p in fusion_problems)
    # the message carries them all, one per line
    text = str(error)
    assert "6 problem(s)" in text
    assert all(p in text for p in problems)


def test_ort_fusions_needs_optimize():
    with pytest.raises(ConfigError) as info:
        OnnxConfig(ort_fusions="cpu", optimize=False)
    assert info.value.problems == ["ort_fusions: needs optimize=True (the fusions run inside the optimiser)"]
    assert OnnxConfig(ort_fusions="cpu").ort_fusions == "cpu"  # the default optimize=True is fine


def test_bad_executorch_backend_lists_the_supported_ones():
    with pytest.raises(ConfigError) as info:
        ExecutorchConfig(backend="coreml", alloc_graph_output=1)
    problems = info.value.problems
    assert len(problems) == 2
    assert problems[0].startswith("backend:") and "'coreml'" in problems[0]
    assert all(name in problems[0] for name in ("xnnpack", "cuda", "mlx"))
    assert problems[1].startswith("alloc_graph_output:") and "expected bool" in problems[1]


@pytest.mark.parametrize(
    ("cls", "field", "value"),
    [
        (DynamoConfig, "dynamic", "yes"),
        (DynamoConfig, "strict", 1),
        (DynamoConfig, "prefer_deferred_runtime_asserts_over_guards", None),
        (DynamoConfig, "dynamic_shapes", "auto"),
        (DynamoConfig, "quantizer", "int8"),
        (OnnxConfig, "opset_version", True),  # a bool is not an opset
        (OnnxConfig, "optimize", "no"),
        (OpenVINOConfig, "compress_to_fp16", "fp16"),
        (OpenVINOConfig, "stateful", 0),
    ],
)
def test_wrong_type_names_the_field(cls, field, value):
    with pytest.raises(ConfigError) as info:
        cls(**{field: value})
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith(f"{field}:")
    assert repr(value) in info.value.problems[0] or type(value).__name__ in info.value.problems[0]


def test_too_old_opset_is_refused():
    with pytest.raises(ConfigError, match="opset_version: 17"):
        OnnxConfig(opset_version=17)
    assert OnnxConfig(opset_version=18).opset_version == 18


def test_config_for_another_format_is_refused():
    with pytest.raises(ConfigError) as info:
        DynamoConfig(export_format=ExportFormat.ONNX)
    assert len(info.value.problems) == 1
    assert "DynamoConfig is for 'dynamo', got 'onnx'" in info.value.problems[0]


def test_from_dict_of_a_non_dict():
    with pytest.raises(ConfigError, match="expected a dict, got list"):
        DynamoConfig.from_dict([("dynamic", True)])


def test_from_dict_refuses_a_saved_quantizer_description():
    with pytest.raises(ConfigError) as info:
        DynamoConfig.from_dict({"quantizer": {"type": "PT2EQuantizer"}})
    assert any(p.startswith("quantizer:") for p in info.value.problems)


def test_bad_saved_dynamic_shapes_is_one_problem_among_others():
    with pytest.raises(ConfigError) as info:
        DynamoConfig.from_dict({"dynamic_shapes": {"x": {"__dims__": [[0, "sometimes"]]}}, "strict": "no"})
    problems = info.value.problems
    assert len(problems) == 2
    assert problems[0].startswith("dynamic_shapes:") and "'sometimes'" in problems[0]
    assert problems[1].startswith("strict:")


# --- AutoExportConfig ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "cls"),
    [
        ("dynamo", DynamoConfig),
        ("onnx", OnnxConfig),
        ("executorch", ExecutorchConfig),
        ("openvino", OpenVINOConfig),
        ("ONNX", OnnxConfig),
        (ExportFormat.OPENVINO, OpenVINOConfig),
    ],
)
def test_auto_export_config_dispatches_on_export_format(fmt, cls):
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    assert type(config) is cls
    assert config.dynamic is True
    assert config.export_format is SPEC_FIELDS[cls][0][1]


def test_auto_export_config_keeps_backend_fields():
    config = AutoExportConfig.from_dict({"export_format": "executorch", "backend": "cuda", "alloc_graph_input": False})
    assert (config.backend, config.alloc_graph_input) == ("cuda", False)


def test_auto_export_config_unknown_format():
    with pytest.raises(ConfigError) as info:
        AutoExportConfig.from_dict({"export_format": "tflite"})
    (problem,) = info.value.problems
    assert problem.startswith("export_format:") and "'tflite'" in problem
    assert all(name in problem for name in ("dynamo", "onnx", "executorch", "openvino"))


def test_auto_export_config_missing_format():
    with pytest.raises(ConfigError) as info:
        AutoExportConfig.from_dict({"dynamic": True})
    (problem,) = info.value.problems
    assert "export_format" in problem and "dynamo" in problem


def test_auto_export_config_not_a_dict():
    with pytest.raises(ConfigError, match="expected a dict"):
        AutoExportConfig.from_dict(DynamoConfig())


def test_auto_export_config_reports_the_target_class_problems():
    with pytest.raises(ConfigError) as info:
        AutoExportConfig.from_dict({"export_format": "openvino", "stateful": "yes", "optimize": True})
    assert info.value.what == "OpenVINOConfig"
    assert len(info.value.problems) == 2
    assert any("'optimize'" in p for p in info.value.problems)  # an OnnxConfig key is unknown to OpenVINOConfig
    assert any(p.startswith("stateful:") for p in info.value.problems)


@pytest.mark.parametrize("cls", [AutoExportConfig, AutoHfExporter])
def test_auto_classes_cannot_be_instantiated(cls):
    with pytest.raises(OSError, match=r"from_(dict|config)"):
        cls()


def test_quantizer_is_described_in_to_dict_but_not_rebuilt():
    from hfexport import ExportQuantizer

    config = DynamoConfig(quantizer=ExportQuantizer(calibration_dataset=[{"x": 1}]))
    data = json.loads(config.to_json_string())
    assert data["quantizer"] == {"type": "ExportQuantizer", "calibrated": True}
    with pytest.raises(ConfigError) as info:
        DynamoConfig.from_dict(data)
    (problem,) = info.value.problems
    assert problem.startswith("quantizer:") and "ExportQuantizer" in problem


def test_executorch_dict_with_every_kind_of_problem():
    with pytest.raises(ConfigError) as info:
        AutoExportConfig.from_dict(
            {
                "export_format": "executorch",
                "backend": "vulkan",
                "dynamic": "yes",
                "stateful": True,  # an OpenVINOConfig field
                "alloc_mutable_buffers": None,
            }
        )
    problems = info.value.problems
    assert len(problems) == 4, problems
    assert problems[0].startswith("unknown key 'stateful'") and "'backend'" in problems[0]
    assert any(p.startswith("backend:") and "'vulkan'" in p and "xnnpack" in p for p in problems)
    assert any(p.startswith("dynamic:") and "expected bool" in p for p in problems)
    assert any(p.startswith("alloc_mutable_buffers:") and "expected bool" in p for p in problems)
