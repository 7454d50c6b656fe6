"""The backend registry: built-in formats resolve lazily, a custom backend registers and round-trips."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

import hfexport
import hfexport.registry as registry
from hfexport import (
    AutoExportConfig,
    AutoHfExporter,
    ConfigError,
    DynamoConfig,
    ExportConfigMixin,
    ExportedModel,
    HfExporter,
    ModelRunner,
    register_backend,
)


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    """Registrations made by a test are dropped after it (the registry keeps module-level dicts)."""
    for name in ("_exporters", "_runners", "_configs"):
        monkeypatch.setattr(registry, name, dict(getattr(registry, name)))


# --- a custom backend -------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ToyConfig(ExportConfigMixin):
    export_format: str = "toy"
    dynamic: bool = False
    strict: bool = False
    dynamic_shapes: Any = None
    prefer_deferred_runtime_asserts_over_guards: bool = False
    scale: float = 1.0

    _checks: ClassVar = {"dynamic": ((bool,), None), "scale": ((float,), None)}


class ToyExporter(HfExporter):
    """torch.export under another name; the program is saved with torch.export.save."""

    export_format = "toy"
    config_class = ToyConfig
    saved: ClassVar[list[str]] = []
    loaded: ClassVar[list[str]] = []

    def program_suffix(self) -> str:
        return ".toy"

    def save_program(self, program, path):
        type(self).saved.append(Path(path).name)
        torch.export.save(program, str(path))

    def load_program(self, path):
        type(self).loaded.append(Path(path).name)
        return torch.export.load(str(path))


class ToyRunner(ModelRunner):
    export_format = "toy"
    created: ClassVar[int] = 0

    def __init__(self, program, metadata):
        super().__init__(metadata)
        self._module = program.module()

    @classmethod
    def _create(cls, program, metadata, device=None, **runner_kwargs):
        cls.created += 1
        return cls(program, metadata)

    def run(self, inputs, *, share_inputs, share_outputs):
        return self._module(**inputs)


class AffineModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.linear(x) * 2.0


@pytest.fixture
def toy_backend():
    ToyExporter.saved.clear()
    ToyExporter.loaded.clear()
    ToyRunner.created = 0
    register_backend(ToyExporter, runner=ToyRunner)
    return ToyExporter


# --- built-ins ---------------------------------------------------------------------------------------------------------


def test_from_config_instance_gives_dynamo_exporter():
    exporter = AutoHfExporter.from_config(DynamoConfig())
    assert type(exporter) is hfexport.DynamoExporter
    assert isinstance(exporter, HfExporter)


def test_from_config_dict_gives_dynamo_exporter():
    exporter = AutoHfExporter.from_config({"export_format": "dynamo", "dynamic": True})
    assert type(exporter) is hfexport.DynamoExporter


def test_from_config_dict_with_problems_raises_config_error():
    with pytest.raises(ConfigError) as info:
        AutoHfExporter.from_config({"export_format": "dynamo", "dynamic": "yes", "colour": 1})
    assert len(info.value.problems) == 2


def test_from_config_of_something_else():
    with pytest.raises(ConfigError, match="expected an export config or a dict, got str"):
        AutoHfExporter.from_config("dynamo")


def test_builtin_formats_are_known_without_importing_backends():
    assert set(registry.known_formats()) >= {"dynamo", "onnx", "executorch", "openvino"}
    assert registry.config_class_for("onnx") is hfexport.OnnxConfig
    assert registry.config_class_for("nope") is None


def test_dynamo_runner_is_resolved_lazily():
    from hfexport.backends.dynamo.runner import DynamoRunner

    assert registry.runner_class_for("dynamo") is DynamoRunner
    assert registry.exporter_class_for(hfexport.ExportFormat.DYNAMO) is hfexport.DynamoExporter


def test_unknown_format_has_no_exporter():
    with pytest.raises(ConfigError, match="no backend registered for 'toy'"):
        registry.exporter_class_for("toy")


# --- a custom backend ---------------------------------------------------------------------------------------------


def test_register_backend_makes_the_auto_classes_find_it(toy_backend):
    config = AutoExportConfig.from_dict({"export_format": "toy"})
    assert type(config) is ToyConfig
    assert config.scale == 1.0
    config = AutoExportConfig.from_dict({"export_format": "toy", "scale": 0.5})
    assert config.scale == 0.5
    assert type(AutoHfExporter.from_config(config)) is ToyExporter
    assert type(AutoHfExporter.from_config({"export_format": "toy"})) is ToyExporter
    assert registry.runner_class_for("toy") is ToyRunner
    assert "toy" in registry.known_formats()


def test_custom_config_validation_still_collects_problems(toy_backend):
    with pytest.raises(ConfigError) as info:
        AutoExportConfig.from_dict({"export_format": "toy", "scale": "big", "dynamic": 2, "extra": 1})
    assert info.value.what == "ToyConfig"
    assert len(info.value.problems) == 3


def test_register_backend_works_as_a_decorator():
    @dataclasses.dataclass
    class OtherConfig(ExportConfigMixin):
        export_format: str = "other"

    @register_backend
    class OtherExporter(ToyExporter):
        export_format = "other"
        config_class = OtherConfig

    assert OtherExporter.__name__ == "OtherExporter"  # the decorator returns the class itself
    assert type(AutoHfExporter.from_config(OtherConfig())) is OtherExporter


def test_registrations_do_not_leak_between_tests():
    # runs after the tests above registered "toy" and "other"
    assert "toy" not in registry._exporters and "toy" not in registry._configs
    assert "other" not in registry._configs
    with pytest.raises(ConfigError, match="unknown format 'toy'"):
        AutoExportConfig.from_dict({"export_format": "toy"})


def test_custom_backend_exports_runs_saves_and_loads(toy_backend, tmp_path):
    model = AffineModule().eval()
    x = torch.randn(2, 4)
    exported = AutoHfExporter.from_config({"export_format": "toy"}).export(model, {"x": x}, ToyConfig())
    assert exported.export_format == "toy"
    assert exported.components["model"].metadata.export_config["export_format"] == "toy"
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(exported(x=x), expected)
    assert ToyRunner.created == 1

    exported.save_pretrained(tmp_path)
    assert ToyExporter.saved == ["model.toy"]
    assert (tmp_path / "model.toy").is_file()
    loaded = ExportedModel.from_pretrained(tmp_path)
    assert ToyExporter.loaded == ["model.toy"]
    assert loaded.export_format == "toy"
    assert isinstance(loaded.runner("model"), ToyRunner)
    torch.testing.assert_close(loaded(x=x), expected)


def test_custom_format_without_runner(tmp_path):
    @dataclasses.dataclass
    class LonelyConfig(ExportConfigMixin):
        export_format: str = "lonely"

    class LonelyExporter(ToyExporter):
        export_format = "lonely"
        config_class = LonelyConfig

    register_backend(LonelyExporter)
    assert type(AutoHfExporter.from_config(LonelyConfig())) is LonelyExporter
    with pytest.raises(ConfigError, match="no runner registered for 'lonely'"):
        registry.runner_class_for("lonely")


def test_re_registering_a_format_replaces_it(toy_backend):
    class ToyExporter2(ToyExporter):
        pass

    register_backend(ToyExporter2)
    assert type(AutoHfExporter.from_config(ToyConfig())) is ToyExporter2
    assert registry.runner_class_for("toy") is ToyRunner  # no runner given: the earlier one stays


# --- bad registrations -------------------------------------------------------------------------------------------


def test_registration_without_config_class():
    class NoConfig(ToyExporter):
        export_format = "noconfig"
        config_class = None

    with pytest.raises(ConfigError) as info:
        register_backend(NoConfig)
    assert info.value.problems == ["NoConfig.config_class must be an ExportConfigMixin subclass"]
    assert "noconfig" not in registry._exporters and "noconfig" not in registry._configs


def test_registration_with_a_config_class_that_is_not_a_config():
    class PlainConfig:
        export_format = "plain"

    class Plain(ToyExporter):
        export_format = "plain"
        config_class = PlainConfig

    with pytest.raises(ConfigError, match="config_class must be an ExportConfigMixin subclass"):
        register_backend(Plain)


def test_registration_without_export_format_lists_both_problems():
    class Bare(HfExporter):
        def export_program(self, model, sample_inputs, config):
            raise NotImplementedError

        def save_program(self, program, path):
            raise NotImplementedError

        def load_program(self, path):
            raise NotImplementedError

    with pytest.raises(ConfigError) as info:
        register_backend(Bare)
    assert info.value.problems == [
        "Bare.export_format is not set",
        "Bare.config_class must be an ExportConfigMixin subclass",
    ]
    assert isinstance(info.value, ValueError)


def test_registration_whose_config_is_for_another_format():
    class Mismatch(ToyExporter):
        export_format = "mismatch"
        config_class = DynamoConfig  # would make AutoExportConfig build a DynamoConfig that rejects "mismatch"

    with pytest.raises(ConfigError) as info:
        register_backend(Mismatch)
    (problem,) = info.value.problems
    assert "DynamoConfig" in problem and "'mismatch'" in problem and "'dynamo'" in problem
    assert "mismatch" not in registry._configs
