"""``ExportedModel`` and ``ExportedComponent``: exported graphs, called like the model they came from."""

from __future__ import annotations

import dataclasses
import os
import re
import threading
from pathlib import Path
from typing import Any

from ._versions import __version__
from .configs import ExportFormat, parse_format
from .derived import derive
from .errors import HfExportError, ManifestError, UnsupportedError
from .manifest import MANIFEST_NAME, parse_manifest, read_manifest, write_export
from .metadata import ExportMetadata
from .pytrees import register_spec_types

__all__ = ["ExportedModel", "ExportedComponent"]

CONFIG_NAME = "config.json"
GENERATION_CONFIG_NAME = "generation_config.json"


@dataclasses.dataclass
class ExportedComponent:
    """One exported graph: the backend's program and what the exporter recorded about it."""

    program: Any
    metadata: ExportMetadata


class ExportedModel:
    """An exported model: its graphs and the configs they were traced against, called like the source model.

    Example:
        >>> exported = DynamoExporter().export(model, inputs, DynamoConfig(dynamic=True))
        >>> exported.save_pretrained("exported")
        >>> outputs = ExportedModel.from_pretrained("exported")(**inputs)
        >>> outputs.logits.shape
    """

    def __init__(
        self,
        components: dict[str, ExportedComponent],
        export_format: ExportFormat | str,
        config: Any = None,
        generation_config: Any = None,
    ):
        self.components = dict(components)
        self.export_format = parse_format(export_format)
        self.config = config
        self.generation_config = generation_config
        self.source_directory: Path | None = None
        self._runners: dict[str, Any] = {}
        self._runners_lock = threading.RLock()
        self._device: Any = None
        self._runner_kwargs: dict[str, Any] = {}

    def __repr__(self) -> str:
        names = ", ".join(f"{n}: {c.metadata.architecture}" for n, c in self.components.items())
        return f"ExportedModel(format={str(self.export_format)!r}, components={{{names}}})"

    # --- programs and runners -----------------------------------------------------------------------------------

    @property
    def program(self) -> Any:
        """The backend's own program, for a single-graph export."""
        if list(self.components) != ["model"]:
            raise UnsupportedError(
                f"this export has several components {list(self.components)}; use .components[name].program"
            )
        return self.components["model"].program

    def to(self, device: Any = None, **runner_kwargs: Any) -> ExportedModel:
        """Load the programs on their backend's runtime, on ``device`` (the backend's default when ``None``).

        ``runner_kwargs`` go to the backend's runner (``providers``/``session_options`` for ONNX Runtime,
        ``config``/``torch_threads`` for OpenVINO).
        """
        self._device = device
        self._runner_kwargs = dict(runner_kwargs)
        self._runners = {}
        for name in self.components:
            self.runner(name)
        return self

    def runner(self, name: str = "model") -> Any:
        """The runner of one component (created on first use)."""
        if name not in self.components:
            raise KeyError(f"no component {name!r}; components: {list(self.components)}")
        runner = self._runners.get(name)
        if runner is not None:
            return runner
        # threads asking at once must get one runner: a stateful program's prefill and decode share its state
        with self._runners_lock:
            if name not in self._runners:
                from .runner import ModelRunner

                c = self.components[name]
                # components served by one program (a static-cache prefill run by the decode graph) share its runner:
                # one compiled model, and a stateful backend's state carries from the prefill call to the decode calls
                shared = next((n for n in self._runners if self.components[n].program is c.program), None)
                self._runners[name] = self._runners[shared] if shared else ModelRunner.from_program(
                    c.program, c.metadata, device=self._device, **self._runner_kwargs
                )
            return self._runners[name]

    def __call__(self, share_inputs: bool = True, share_outputs: bool = False, **kwargs: Any) -> Any:
        """Run a single-graph export; returns what the source model returns (its ``ModelOutput`` type).

        Kwargs the export was not traced with are dropped (one warning), so a processor's whole output can be
        passed.
        """
        if "model" not in self.components:
            raise UnsupportedError(
                f"this export has the generation components {list(self.components)}: use .generate(...) or "
                ".runner(name)(...) to run one component"
            )
        recipes = self.components["model"].metadata.derived_inputs
        if recipes:  # (M-RoPE positions come from the model class's own method, which needs the config)
            kwargs = {**kwargs, **derive(recipes, kwargs, config=self.config)}
        return self.runner("model")(share_inputs=share_inputs, share_outputs=share_outputs, **kwargs)

    def generate(self, **kwargs: Any) -> Any:
        """Generate with the exported components alone, like ``model.generate`` (greedy, sampling, beam search).

        Takes the processor's output and what ``model.generate`` takes: ``generation_config=``, any generation
        config field as a keyword (penalties, bad words, suppressed and forced tokens, lengths, warpers, stop
        strings with ``tokenizer=``), ``logits_processor=``, ``stopping_criteria=``, ``prefix_allowed_tokens_fn=``
        and ``streamer=``; the processors and criteria are transformers' own, built as ``model.generate`` builds
        them. Returns the token ids, or a ``GenerateDecoderOnlyOutput`` / ``GenerateEncoderDecoderOutput`` (scores,
        logits) with ``return_dict_in_generate=True``. What it cannot honour (guidance, contrastive search,
        attentions, assisted decoding, ...: :data:`hfexport.generation.plan.REFUSED`) is refused by name. A Whisper
        export generates with Whisper's own generate (``language=``, ``task=``, ``return_timestamps=``, language
        detection, long-form segments, temperature fallback; the decoder prompt and EOS stripped).

        Example:
            >>> exported = DynamoExporter().export_for_generation(model, inputs, DynamoConfig(dynamic=True))
            >>> exported.generate(**tokenizer(["Hello"], return_tensors="pt"), max_new_tokens=16)
        """
        from .generation import generate

        return generate(self, **kwargs)

    # --- save / load ---------------------------------------------------------------------------------------------

    def _exporter(self) -> Any:
        from .registry import exporter_class_for

        return exporter_class_for(self.export_format)()

    def save_pretrained(self, save_directory: str | Path, push_to_hub: bool = False, **kwargs: Any) -> Path:
        """Write the components (one file each, plus what the format keeps beside it), the configs and the manifest.

        The save is atomic: an interrupted save never leaves a directory that loads wrong.

        Args:
            save_directory: Where to write (created if missing).
            push_to_hub: Upload the directory to the Hub afterwards.
            kwargs: For the upload: ``repo_id`` (defaults to the directory name), ``commit_message``, ``token``,
                ``private``.
        """
        exporter = self._exporter()

        def write_files(staging: Path) -> dict[str, Any]:
            components = {}
            files = exporter.save_programs({n: c.program for n, c in self.components.items()}, staging)
            for name, component in self.components.items():
                components[name] = {
                    "program": files[name][0],
                    "files": files[name],
                    "metadata": component.metadata.to_dict(),
                }
            configs = {}
            if self.config is not None:
                (staging / CONFIG_NAME).write_text(self.config.to_json_string(use_diff=False))
                configs["config"] = CONFIG_NAME
            if self.generation_config is not None:
                (staging / GENERATION_CONFIG_NAME).write_text(self.generation_config.to_json_string(use_diff=True))
                configs["generation_config"] = GENERATION_CONFIG_NAME
            return {
                "format": "hfexport",
                "hfexport_version": __version__,
                "export_format": str(self.export_format),
                "components": components,
                "configs": configs,
            }

        directory = Path(save_directory)
        write_export(directory, write_files)
        if push_to_hub:
            self._push(directory, **kwargs)
        return directory

    @staticmethod
    def _push(directory: Path, repo_id: str | None = None, commit_message: str | None = None, **hub_kwargs: Any) -> None:
        from huggingface_hub import HfApi

        api = HfApi(token=hub_kwargs.pop("token", None))
        repo_id = repo_id or directory.name
        api.create_repo(repo_id, private=hub_kwargs.pop("private", None), exist_ok=True)
        api.upload_folder(
            repo_id=repo_id,
            folder_path=str(directory),
            commit_message=commit_message or "Upload hfexport export",
            ignore_patterns=[".hfexport-staging/*"],
            **hub_kwargs,
        )

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | Path,
        device: Any = None,
        cache_dir: str | Path | None = None,
        force_download: bool = False,
        local_files_only: bool = False,
        token: str | bool | None = None,
        revision: str = "main",
        subfolder: str = "",
        trust_remote_code: bool = False,
        **runner_kwargs: Any,
    ) -> ExportedModel:
        """Load what :meth:`save_pretrained` wrote, from a local directory or a Hub repo id, ready to run.

        From the Hub, only the files the manifest names are downloaded. Every file is checked against the manifest's
        size and sha256 before any program is read.
        """
        local = _local_folder(pretrained_model_name_or_path, subfolder)
        if local is None:
            local = _download(
                str(pretrained_model_name_or_path),
                cache_dir=cache_dir,
                force_download=force_download,
                local_files_only=local_files_only,
                token=token,
                revision=revision,
                subfolder=subfolder,
            )
        manifest, root = read_manifest(local)
        locations = manifest["_locations"]
        from .registry import exporter_class_for

        exporter = exporter_class_for(manifest["export_format"])()
        exporter.validate_environment()
        if getattr(exporter, "loads_machine_code", False) and not trust_remote_code:
            raise UnsupportedError(
                f"{root}: this {manifest['export_format']} export holds compiled machine code (a shared library) "
                "that runs as it loads; load it only from a source you trust, with trust_remote_code=True"
            )
        components = {}
        programs: dict[str, Any] = {}  # components saved as one file (one graph serving two stages) load it once
        for name, entry in manifest["components"].items():
            program_file = entry.get("program", entry["files"][0])
            metadata = _metadata(root, name, entry["metadata"])
            register_spec_types(metadata.in_spec, metadata.out_spec)  # the program's specs name them too
            if program_file not in programs:
                with _as_manifest_error(root, program_file, f"the {manifest['export_format']} program"):
                    programs[program_file] = exporter.load_program(Path(locations[program_file]))
            components[name] = ExportedComponent(programs[program_file], metadata)
        configs = manifest.get("configs") or {}
        with _as_manifest_error(root, configs.get("config"), "a model config"):
            config = _load_config(locations.get(configs.get("config")), trust_remote_code)
        with _as_manifest_error(root, configs.get("generation_config"), "a generation config"):
            generation_config = _load_generation_config(locations.get(configs.get("generation_config")))
        exported = cls(components, manifest["export_format"], config=config, generation_config=generation_config)
        exported.source_directory = root
        files = ", ".join(dict.fromkeys(e.get("program", e["files"][0]) for e in manifest["components"].values()))
        with _as_manifest_error(root, files, f"the {manifest['export_format']} program", run=True):
            return exported.to(device, **runner_kwargs)


def _looks_local(name: str) -> bool:
    """Whether ``name`` is meant as a local path, never a Hub repo id: it exists, starts with ``.``, ``/`` or ``~``,
    or is not of the form ``name`` / ``namespace/name`` that the Hub accepts (two separators, a backslash)."""
    if os.path.lexists(name) or name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1:
        return True
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return True
    return False


def _local_folder(name: str | Path, subfolder: str) -> Path | None:
    """The local export folder ``name`` names, or None for a Hub repo id; a local-looking path that is not a folder
    is an error at once (a mistyped folder never waits on the network)."""
    path = Path(os.path.expanduser(str(name)))
    local = path / subfolder if subfolder else path
    if local.is_dir():
        return local
    if isinstance(name, Path) or _looks_local(str(name)):
        what = "is a file, not an export folder" if local.exists() else "does not exist"
        raise ManifestError(str(local), [f"the local path {what} (a path is never looked up on the Hub; check the "
                                         "spelling, or pass a Hub repo id as 'namespace/name')"])
    return None


def _metadata(root: Path, component: str, values: dict) -> ExportMetadata:
    try:
        return ExportMetadata.from_dict(values)
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
        raise ManifestError(str(root), [f"component {component!r}: its metadata is not one hfexport writes ({e})"]) \
            from None


_SOURCE_LOCATION = re.compile(r"(Exception from )?\S+\.(cpp|cc|h|hpp):\d+:?")


class _as_manifest_error:
    """Turns what a runtime raises on a file the manifest matched (a corrupt program, a config that does not parse)
    into a :class:`ManifestError` naming the file; our own typed errors pass through."""

    def __init__(self, root: Path, file: str | None, what: str, run: bool = False):
        self.root, self.file, self.what, self.run = root, file, what, run

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: BaseException | None, traceback: Any) -> bool:
        if error is None or isinstance(error, (HfExportError, MemoryError)) or not isinstance(error, Exception):
            return False  # (running out of memory says nothing of the file)
        lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
        # runtimes lead with where in their C++ sources they raised ("Exception from src/...cpp:84:"): keep the words
        said = [line for line in lines if not _SOURCE_LOCATION.fullmatch(line)] or lines or [kind.__name__]
        cause = f"{kind.__name__}: {' '.join(said)[:300]}"
        if self.run:
            why = (f"{self.file}: the runtime refused it ({cause}). If the device and runner options are right, the "
                   "file was written corrupt or tampered with before the manifest was sealed")
        else:
            why = (f"{self.file}: cannot be read as {self.what} ({cause}). The file matches the manifest, so it was "
                   "written corrupt or tampered with before the manifest was sealed")
        raise ManifestError(str(self.root), [f"{why}: re-export the model, or get the export from a source you "
                                             "trust"]) from error


def _download(repo_id: str, *, subfolder: str, **hub: Any) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        manifest_path = Path(hf_hub_download(repo_id, MANIFEST_NAME, subfolder=subfolder or None, **hub))
    except Exception as e:  # noqa: BLE001 - every Hub failure becomes one clear error
        raise ManifestError(
            repo_id, [f"not a local directory, and {MANIFEST_NAME} could not be fetched from the Hub: {e}"]
        ) from e
    try:
        text = manifest_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ManifestError(repo_id, [f"{MANIFEST_NAME} cannot be read ({e})"]) from None
    manifest = parse_manifest(text, repo_id)  # every path checked before anything else is downloaded
    missing = []
    for entry in manifest["files"]:
        try:
            hf_hub_download(repo_id, entry["path"], subfolder=subfolder or None, **hub)
        except Exception as e:  # noqa: BLE001 - collected, reported together
            missing.append(f"{entry['path']}: could not be fetched ({type(e).__name__})")
    if missing:
        raise ManifestError(repo_id, missing)
    return manifest_path.parent


def _load_config(path: str | None, trust_remote_code: bool) -> Any:
    if path is None:
        return None
    from transformers import AutoConfig, PretrainedConfig

    # the file the manifest names and verified, never another one the folder holds
    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except (ValueError, KeyError, OSError):
        return PretrainedConfig.from_json_file(path)


def _load_generation_config(path: str | None) -> Any:
    if path is None:
        return None
    from transformers import GenerationConfig

    return GenerationConfig.from_pretrained(str(Path(path).parent), config_file_name=Path(path).name)
