"""``HfExporter``: the backend-independent export flow as a template, around backend hooks.

:meth:`HfExporter.export_program` runs check → prepare → [workaround scope: trace → quantize (FX graph) → signature →
lower] → finish (see :mod:`hfexport.stages`), on a quantized copy of the model when the quantizer works on the eager
module (``quantizes_module``: quantize → export_program). A backend subclasses :class:`HfExporter`, sets
``export_format`` / ``config_class`` / its package needs, implements :meth:`~HfExporter.lower` (the traced program to
the backend's program), :meth:`~HfExporter.finish` (passes over it that need no workaround), :meth:`~HfExporter.
save_program` and :meth:`~HfExporter.load_program`; one whose export is no ``torch.export`` trace may override
:meth:`~HfExporter.export_program` whole, as the spec allows.
"""

from __future__ import annotations

import abc
import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any, ClassVar

import torch

from ._versions import TESTED, check_packages, pip_line
from .capture.derive import derive_vision_inputs
from .capture.prepare import check_attention_implementation, patch_model_config, prepare_for_export
from .capture.shapes import StageDynamicShapes, resolve_dynamic_shapes
from .capture.trace import lowering_scope, trace_program
from .configs import ExportConfigMixin, ExportFormat
from .errors import ConfigError, ExportError, HfExportError, UnsupportedError
from .exported import ExportedComponent, ExportedModel
from .metadata import ExportMetadata
from .pytrees import register_cache_classes
from .quantizers.calibration import calibrate_components, check_quantizers, same_recipe
from .signature import build_export_metadata
from .stages import ExportStep, StageClock, StageTiming, first_lines, hint_for
from .workarounds import applied_workarounds

__all__ = ["HfExporter"]

logger = logging.getLogger(__name__)

class HfExporter(abc.ABC):
    """Abstract base class of the exporters.

    Class attributes a backend sets:
        export_format: Its :class:`~hfexport.ExportFormat` (or a custom string).
        config_class: Its config dataclass.
        required_packages: Distributions it needs, with the minimum version (``{"onnx": "1.21"}``).
        package_extra: The ``hfexport[...]`` extra that installs them (for the pip line in errors).

    Example:
        >>> exporter = DynamoExporter()
        >>> exported = exporter.export(model, inputs, config=DynamoConfig(dynamic=True))
    """

    export_format: ClassVar[ExportFormat | str]
    config_class: ClassVar[type[ExportConfigMixin]]
    required_packages: ClassVar[dict[str, str]] = {}
    package_extra: ClassVar[str | None] = None
    program_filename: ClassVar[str] = "model"
    #: distributions whose versions the metadata of each traced graph records (besides torch and transformers)
    trace_packages: ClassVar[tuple[str, ...]] = ()
    #: the runtime checks a traced program's runtime assertions (else they become outputs the runner checks:
    #: :mod:`hfexport.capture.trace`)
    checks_runtime_asserts: ClassVar[bool] = False
    #: called with each :class:`~hfexport.stages.StageTiming` as its stage ends (the CLI prints them), and with
    #: ``(component, stage)`` as each starts (the CLI shows the elapsed time of a long one)
    on_stage: Callable[[StageTiming], None] | None = None
    on_stage_start: Callable[[str, str], None] | None = None

    @property
    def stage_timings(self) -> list[StageTiming]:
        """Each stage's wall time in the last :meth:`export` / :meth:`export_for_generation`, per component."""
        return self._clock().timings

    def _clock(self) -> StageClock:
        if getattr(self, "_stage_clock", None) is None:
            self._stage_clock = StageClock(self.on_stage, self.on_stage_start)
        return self._stage_clock

    # --- environment --------------------------------------------------------------------------------------------

    @property
    def tested_versions(self) -> dict[str, str]:
        return {name: TESTED[name] for name in ("torch", "transformers", *self.required_packages) if name in TESTED}

    def validate_environment(self) -> None:
        """Raise :class:`MissingPackageError` (with the pip line) for a missing or too-old required package;
        warn once per package when the installed version differs from the tested one."""
        check_packages(type(self).__name__, self.required_packages, self.tested_versions, self._pip_line)

    def _pip_line(self, names: list[str]) -> str:
        try:
            exact = pip_line(names)
        except ValueError:  # a package we have no tested pin for
            exact = "pip install " + " ".join(names)
        if self.package_extra:
            return f"pip install 'hfexport[{self.package_extra}]'   # or: {exact}"
        return exact

    # --- public API -------------------------------------------------------------------------------------------

    def export(
        self,
        model: torch.nn.Module,
        sample_inputs: MutableMapping[str, Any],
        config: ExportConfigMixin | dict[str, Any],
    ) -> ExportedModel:
        """Export the model as one graph: a single ``"model"`` component.

        Args:
            model: The model to export (a ``PreTrainedModel`` or any ``nn.Module``).
            sample_inputs: Forward kwargs, what you would pass to ``model(**sample_inputs)``.
            config: This backend's config, or its dict.

        Returns:
            An :class:`ExportedModel` whose ``.program`` is the backend's program and whose call runs it.
        """
        config = self._check_config(config)
        self.validate_environment()
        check_quantizers({"model": config}, self.export_format)  # an unsupported quantizer: ValueError, before tracing
        self._stage_clock = StageClock(self.on_stage, self.on_stage_start)
        self._stage_clock.checked_quantizers.add(id(getattr(config, "quantizer", None)))
        program, metadata = self._export_component("model", model, sample_inputs, config)
        return ExportedModel(
            {"model": ExportedComponent(program, metadata)},
            export_format=self.export_format,
            config=getattr(model, "config", None),
            generation_config=_generation_config(model),
        )

    def export_for_generation(
        self,
        model: torch.nn.Module,
        sample_inputs: MutableMapping[str, Any],
        config: ExportConfigMixin | dict[str, ExportConfigMixin],
        generation_config: Any = None,
        multi_token_decode: bool = False,
        logits_to_keep_input: bool = False,
    ) -> ExportedModel:
        """Decompose a generative model into its generation stages and export each one.

        See :func:`hfexport.utils.decompose_for_generation` for the component names. ``logits_to_keep_input``: a
        multi-token decode graph also takes ``logits_to_keep``, the query positions whose logits it returns
        (transformers' 1-D index form; every position when a call to its runner names none), so that ``generate()``
        projects a prompt's last position only through the LM head, as eager does with ``logits_to_keep=1``. A loop
        that drives the graph on its runtime directly feeds it that input too.
        """
        from .capture.split import decompose_for_generation, last_logits_only

        self.validate_environment()
        check_quantizers(config, self.export_format)
        check_attention_implementation(model)
        generation_config = _merged_generation_config(model, generation_config)
        self._stage_clock = clock = StageClock(self.on_stage, self.on_stage_start)
        with clock.stage("capture", "generate", model, sample_inputs):
            components = decompose_for_generation(model, sample_inputs, generation_config, multi_token_decode,
                                                  logits_to_keep_input)
        configs = self._component_configs(config, list(components))
        with clock.stage("calibrate", "generate", model, sample_inputs):
            # generate-kwargs calibration samples -> each component's own forward kwargs
            configs = calibrate_components(model, config, configs, self.export_format, generation_config,
                                           multi_token_decode, logits_to_keep_input)
        # checked above: the config's quantizer objects, and the per-component copies calibrate made of one
        checked = [config.values() if isinstance(config, Mapping) else [config]]
        if isinstance(config, ExportConfigMixin):
            checked.append(configs.values())
        clock.checked_quantizers.update(id(getattr(c, "quantizer", None)) for group in checked for c in group)
        _check_stage_shapes(configs, components, sample_inputs)
        exported = {}
        # the prefill last: a backend may run it on the decode graph (serves_prefill) instead of exporting it
        for name in sorted(components, key=lambda n: n == "prefill"):
            submodel, inputs = components[name]
            decode = exported.get("decode")
            if name == "prefill" and decode is not None and same_recipe(configs["prefill"], configs["decode"]) and (
                self.serves_prefill(decode, inputs, multi_token_decode) or _rereads(components, decode)
            ):
                exported[name] = decode
                continue
            if name == "prefill":  # its own graph: the last position's logits only, as generate() reads them
                inputs = last_logits_only(submodel, inputs)
            program, metadata = self._export_component(name, submodel, inputs, _stage_config(configs[name]))
            if name == "decode":
                _check_decode(metadata, multi_token_decode)
            exported[name] = ExportedComponent(program, metadata)
        return ExportedModel(
            {name: exported[name] for name in components},
            export_format=self.export_format,
            config=getattr(model, "config", None),
            generation_config=generation_config or _generation_config(model),
        )

    # --- backend extension points -------------------------------------------------------------------------------

    def serves_prefill(
        self, decode: ExportedComponent, prefill_inputs: Mapping[str, Any], multi_token_decode: bool
    ) -> bool:
        """Whether the exported ``decode`` component can also run the prefill (then no prefill graph is exported,
        and the ``"prefill"`` component is the decode one, its weights stored once and its export time saved).

        A multi-token decode over a static cache can: given the empty cache, the whole prompt in one call (as the
        spec's decode loop does), then every later step. A backend that cannot run it that way overrides this."""
        metadata = decode.metadata
        return multi_token_decode and metadata.cache_type == "StaticCache" and metadata.takes_prompt(prefill_inputs)

    def export_program(
        self, model: torch.nn.Module, sample_inputs: MutableMapping[str, Any], config: ExportConfigMixin
    ) -> tuple[Any, ExportMetadata]:
        """Trace one graph; return the backend's program and the metadata recorded while tracing it.

        The template: check → prepare → [workaround scope: trace → quantize (FX graph) → signature → lower] →
        finish, each stage timed (:attr:`stage_timings`) and a failure inside one raised as an ``ExportError`` that
        names it. A backend implements :meth:`lower` and :meth:`finish`; one whose export needs a scope of its own
        around the whole (an opset, a custom-op library) overrides this and calls :meth:`export_stages`.
        """
        return self.export_stages(model, sample_inputs, config)

    def export_stages(
        self,
        model: torch.nn.Module,
        sample_inputs: MutableMapping[str, Any],
        config: ExportConfigMixin,
        *,
        plan: Any = None,
        static_caches: bool = False,
    ) -> tuple[Any, ExportMetadata]:
        """Run the stages of one graph (see :meth:`export_program`).

        ``plan``: what the backend decided before tracing, handed to its hooks as ``step.plan``. ``static_caches``:
        the caches keep their traced sizes whatever ``config.dynamic`` says (see
        :func:`~hfexport.capture.shapes.resolve_dynamic_shapes`).
        """
        clock = self._clock()
        step = ExportStep(getattr(self, "_component", "model"), model, sample_inputs, config, plan=plan)

        def stage(name: str) -> Any:
            return clock.stage(name, step.component, model, sample_inputs, step)

        quantizer = getattr(config, "quantizer", None)
        with stage("check"):
            check_attention_implementation(model)
            if quantizer is not None and id(quantizer) not in clock.checked_quantizers:
                quantizer.validate_environment(self.export_format)
            self.check(step)
        with stage("prepare"):
            model, inputs, flags = prepare_for_export(model, sample_inputs)
            inputs, derived = derive_vision_inputs(model, inputs)
            step.inputs = inputs
            register_cache_classes(model)
            dynamic_shapes = resolve_dynamic_shapes(config, inputs, static_caches=static_caches)
        was_training = model.training
        model.eval()
        try:
            with applied_workarounds(str(self.export_format), model, inputs) as fired, patch_model_config(
                model, flags
            ), torch.no_grad():
                with stage("trace"):
                    program, assumptions = trace_program(model, inputs, dynamic_shapes, config,
                                                         checks_runtime_asserts=self.checks_runtime_asserts)
                if quantizer is not None and not quantizer.quantizes_module:  # (that one ran before the trace)
                    with stage("quantize"):
                        if quantizer.quantizes_fx_graph:
                            program = quantizer.quantize(program, sample_inputs, self.export_format)
                        else:  # what only the program knows (each op's module), for quantize() after lowering
                            quantizer.read_program(program)
                with stage("signature"):
                    metadata = build_export_metadata(
                        program, model, inputs, config, packages=self.trace_packages, workarounds=fired, flags=flags,
                        assumptions=assumptions,
                    )
                    metadata.derived_inputs = derived
                with stage("lower"), lowering_scope(program):
                    lowered = self.lower(program, metadata, step)
            _warn_specialised(metadata, dynamic_shapes, config)
        finally:
            model.train(was_training)
        with stage("finish"):
            return self.finish(lowered, metadata, step), metadata

    def check(self, step: ExportStep) -> None:
        """Refuse, before tracing, what the backend cannot export (raise ``UnsupportedError`` / ``ConfigError``)."""

    def lower(self, program: torch.export.ExportedProgram, metadata: ExportMetadata, step: ExportStep) -> Any:
        """The traced (and FX-quantized) program as the backend's program. Runs inside the workaround scope, so
        that the backend's workarounds (patches of its converter) apply. The default keeps the ``ExportedProgram``."""
        return program

    def finish(self, lowered: Any, metadata: ExportMetadata, step: ExportStep) -> Any:
        """Passes over the lowered program outside the workaround scope (graph optimisation, weight compression,
        a quantizer that works on the backend's model: :meth:`quantize_lowered`). The default returns it as is."""
        return lowered

    def quantize_lowered(self, lowered: Any, step: ExportStep) -> Any:
        """Apply the config's quantizer to the backend's own model (one that does not quantize the FX graph)."""
        quantizer = getattr(step.config, "quantizer", None)
        if quantizer is None or quantizer.quantizes_fx_graph or quantizer.quantizes_module:
            return lowered
        return quantizer.quantize(lowered, step.sample_inputs, self.export_format)

    @abc.abstractmethod
    def save_program(self, program: Any, path: str | Path) -> None:
        """Write one program to ``path`` in the backend's file format."""

    @abc.abstractmethod
    def load_program(self, path: str | Path) -> Any:
        """Read back a program written by :meth:`save_program`."""

    def program_files(self, filename: str) -> list[str]:
        """The files :meth:`save_program` writes for a program saved as ``filename``."""
        return [filename]

    def program_suffix(self) -> str:
        """File extension of a saved program, e.g. ``".pt2"``."""
        return ""

    def save_programs(self, programs: Mapping[str, Any], directory: Path) -> dict[str, list[str]]:
        """Write every component's program into ``directory``; return each component's files, its program first.

        The default saves each program with :meth:`save_program` as ``<name><suffix>``; components served by one
        program (a static-cache prefill run by the decode graph, see :meth:`serves_prefill`) share its file, named
        after the last of them. A backend that can store what distinct programs share once (weights in ONNX
        external data) overrides this.
        """
        filenames = {id(program): f"{name}{self.program_suffix()}" for name, program in programs.items()}
        written: set[str] = set()
        files = {}
        for name, program in programs.items():
            filename = filenames[id(program)]
            if filename not in written:
                self.save_program(program, Path(directory) / filename)
                written.add(filename)
            files[name] = self.program_files(filename)
        return files

    # --- helpers ----------------------------------------------------------------------------------------------

    def _check_config(self, config: Any) -> ExportConfigMixin:
        if isinstance(config, Mapping):
            values = dict(config)
            values.setdefault("export_format", str(self.export_format))
            config = self.config_class.from_dict(values)
        # the backend configs subclass DynamoConfig: an OnnxConfig is a DynamoConfig by type, not by format
        fmt = getattr(config, "export_format", None)
        if not isinstance(config, self.config_class) or (fmt is not None and str(fmt) != str(self.export_format)):
            raise ConfigError(
                type(self).__name__,
                [f"config must be a {self.config_class.__name__} (or its dict), got {type(config).__name__}"
                 + (f" (export_format {str(fmt)!r}): use the exporter for that format, or a "
                    f"{self.config_class.__name__}" if fmt is not None and isinstance(config, self.config_class)
                    else "")],
            )
        return config

    def _component_configs(self, config: Any, names: list[str]) -> dict[str, ExportConfigMixin]:
        if isinstance(config, Mapping) and "export_format" not in config and all(
            isinstance(v, ExportConfigMixin | Mapping) for v in config.values()
        ) and config:
            missing = [n for n in names if n not in config]
            unknown = [n for n in config if n not in names]
            problems = [f"no config for component {n!r}" for n in missing]
            problems += [f"{n!r} is not a component of this model (components: {names})" for n in unknown]
            if problems:
                raise ConfigError("per-component export config", problems)
            return {n: self._check_config(config[n]) for n in names}
        single = self._check_config(config)
        return {n: single for n in names}

    def _export_component(
        self, name: str, model: torch.nn.Module, inputs: MutableMapping[str, Any], config: ExportConfigMixin
    ) -> tuple[Any, ExportMetadata]:
        start = time.perf_counter()
        self._component = name
        try:
            model = self._quantized_module(name, model, inputs, config)
            program, metadata = self.export_program(model, inputs, config)
        except HfExportError:
            raise
        except Exception as e:  # noqa: BLE001 - a backend's own export_program: re-raised with the component
            raise ExportError(
                f"{type(e).__name__}: {first_lines(str(e))}",
                component=name,
                submodule=type(model).__name__,
                input_keys=list(inputs) if isinstance(inputs, Mapping) else [],
                stage="export_program",
                hint=hint_for(e),
            ) from e
        finally:
            self._component = "model"
        logger.info("exported %s (%s) in %.1fs", name, type(model).__name__, time.perf_counter() - start)
        return program, metadata

    def _quantized_module(
        self, name: str, model: torch.nn.Module, inputs: MutableMapping[str, Any], config: ExportConfigMixin
    ) -> torch.nn.Module:
        """A quantized copy of the (sub)model for a quantizer of the eager module (``quantizes_module``), before the
        backend plans and traces it (its stages then see the quantized layers); the model itself otherwise."""
        quantizer = getattr(config, "quantizer", None)
        if quantizer is None or not quantizer.quantizes_module:
            return model
        with self._clock().stage("quantize", name, model, inputs):
            return quantizer.quantize_module(model, inputs, self.export_format)


def _warn_specialised(metadata: ExportMetadata, dynamic_shapes: Any, config: ExportConfigMixin) -> None:
    """With ``dynamic=True``, say which user-input dims the model's code pinned to their traced size."""
    if not getattr(config, "dynamic", False) or getattr(config, "dynamic_shapes", None) is not None:
        return
    pinned = [f"{spec.name}[{i}]={size}" for spec in metadata.inputs if spec.role.value == "input"
              for i, size in enumerate(spec.shape) if isinstance(size, int) and size > 1]
    if pinned:
        logger.info("dims specialised while tracing (the model branches on them): %s", ", ".join(pinned))


def _merged_generation_config(model: torch.nn.Module, generation_config: Any) -> Any:
    """``generation_config`` merged into a copy of the model's own: the fields it sets (those that differ from
    ``GenerationConfig``'s defaults, e.g. ``cache_implementation`` and ``max_cache_len``) override, the model's eos,
    pad, decoder-start ids and the rest stay, as ``model.generate(generation_config=...)`` merges them. Without a
    model config (or without one to merge), the given one as is."""
    own = getattr(model, "generation_config", None)
    if generation_config is None or own is None or generation_config is own:
        return generation_config
    merged = copy.deepcopy(own)
    merged.update(**generation_config.to_diff_dict())
    return merged


def _generation_config(model: torch.nn.Module) -> Any:
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate) and can_generate():
        return getattr(model, "generation_config", None)
    return None


def _stage_config(config: ExportConfigMixin) -> ExportConfigMixin:
    """``config`` for one stage of ``export_for_generation``: explicit ``dynamic_shapes`` apply to the inputs they
    name, the inputs the decomposition made get ``Dim.AUTO`` (see :class:`StageDynamicShapes`)."""
    shapes = getattr(config, "dynamic_shapes", None)
    if not isinstance(shapes, Mapping) or isinstance(shapes, StageDynamicShapes):
        return config
    return dataclasses.replace(config, dynamic_shapes=StageDynamicShapes(shapes))


def _check_stage_shapes(
    configs: Mapping[str, ExportConfigMixin], components: Mapping[str, Any], sample_inputs: Mapping[str, Any]
) -> None:
    """Each name in a stage config's explicit ``dynamic_shapes`` must be a sample input (the decomposition may
    consume it, as it turns a 2-d attention mask into positions) or an input of a stage it configures."""
    by_config: dict[int, tuple[Any, set[str]]] = {}
    for name, cfg in configs.items():
        shapes = getattr(cfg, "dynamic_shapes", None)
        if isinstance(shapes, Mapping):
            names = by_config.setdefault(id(shapes), (shapes, set(sample_inputs)))[1]
            names.update(components[name][1])
    problems = [
        f"{key!r} is neither a sample input nor an input of a generation stage it configures ({sorted(names)})"
        for shapes, names in by_config.values() for key in shapes if key not in names
    ]
    if problems:
        raise ConfigError("dynamic_shapes", problems)


def _check_decode(metadata: ExportMetadata, multi_token_decode: bool) -> None:
    """A decode graph must hand its cache on (a model that keeps its state on its modules cannot), and a
    multi-token one whose query axis came out fixed at several tokens cannot run a one-token step."""
    if metadata.cache_leaves() and not metadata.returns_cache:
        raise UnsupportedError(
            f"{metadata.architecture}'s decode graph takes a cache ({metadata.cache_kwarg}) but neither returns "
            "nor updates it: the model keeps its recurrent state on its own modules (assigned attributes, which "
            "the trace folds into constants), so no export can carry that state from one call to the next. "
            "Generate with the eager model, or export the forward alone (export(), no generate())."
        )
    length = metadata.query_axis()
    if multi_token_decode and isinstance(length, int) and length > 1:
        raise UnsupportedError(
            f"the decode graph was exported for multi_token_decode=True, but its query axis came out fixed at "
            f"{length} tokens (the model's code or the backend's lowering specialised it), so it cannot run a "
            "one-token decode step. Export with multi_token_decode=False."
        )


def _rereads(components: Mapping[str, Any], decode: ExportedComponent) -> bool:
    """Whether the decode graph is a model's whole-sequence forward (a model that keeps no cache, see
    ``capture.decompose.rereads_sequence``): then it runs the prefill too, and ``generate()`` feeds it the sequence
    so far at each step."""
    from .capture.decompose import rereads_sequence

    if decode.metadata.cache_kwarg is not None:
        return False
    if not rereads_sequence([components["prefill"][1], components["decode"][1]]):
        return False
    if not isinstance(decode.metadata.query_axis(("input_ids",)), str):
        raise UnsupportedError(
            f"{decode.metadata.architecture} keeps no cache: generate() runs it on the whole sequence at every "
            "step, but its graph came out with a fixed sequence length. Export with dynamic=True."
        )
    return True
