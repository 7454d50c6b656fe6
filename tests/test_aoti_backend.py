"""The AOTInductor backend: compiled packages that match eager, weights stored once, and loads that run no code the
user did not trust, on no machine the code was not built for.

Five compiles (tiny Llama): a plain ``export``, a dynamic-cache prefill + decode (all ``gemm="aten"``, ~12 s each on
2 cores), and a static-cache multi-token recipe with the default ``gemm="auto"``: its decode on Inductor's GEMM
template autotuned against torch's mm over weights frozen into the library (~40 s), its prefill on torch's mm.
"""

from __future__ import annotations

import json
import shutil
import zipfile

import pytest
import torch
from backend_fixtures import CASE, model, plain_fixture, static_config  # noqa: F401 (fixtures)

from hfexport import AotiConfig, AutoHfExporter, ConfigError, ExportedModel, ManifestError, UnsupportedError
from hfexport.backends.aoti.package import WEIGHTS_NAME, AotiProgram, check_package
from hfexport.exporter_aoti import AotiExporter

plain = plain_fixture(AotiExporter, AotiConfig(dynamic=True, gemm="aten"))


@pytest.fixture(scope="module")
def generative(model):
    gen = static_config(model)
    gen.cache_implementation = None  # the model's own dynamic cache: a prefill and a decode package
    return AotiExporter().export_for_generation(model, CASE.inputs(2, 7), AotiConfig(dynamic=True, gemm="aten"),
                                                generation_config=gen)


@pytest.fixture(scope="module")
def saved(generative, tmp_path_factory):
    directory = tmp_path_factory.mktemp("aoti")
    generative.save_pretrained(directory)
    return directory


def _eager_generate(model, prompt, gen, new=24):
    with torch.no_grad():
        return model.generate(**prompt, generation_config=gen, max_new_tokens=new, min_new_tokens=new)


def test_export_matches_eager_at_shapes_it_was_not_traced_with(model, plain):
    assert isinstance(plain.program, AotiProgram)
    for batch, seq in ((2, 7), (3, 11), (1, 4)):
        inputs = CASE.inputs(batch, seq)
        with torch.no_grad():
            expected = model(**inputs).logits
        got = plain(**inputs).logits
        assert got.shape == expected.shape
        assert (got - expected).abs().max().item() <= 1e-4, (batch, seq)


def test_generate_with_a_dynamic_cache_is_eager_token_for_token(model, generative):
    assert generative.components["prefill"].program is not generative.components["decode"].program
    gen = static_config(model)
    gen.cache_implementation = None
    prompt = CASE.inputs(2, 9)  # left-padded batch of 2 (the generation loop's mask is a view: made contiguous)
    expected = _eager_generate(model, prompt, gen)
    assert torch.equal(generative.generate(**prompt, max_new_tokens=24, min_new_tokens=24), expected)


def _sources(path):
    with zipfile.ZipFile(path) as archive:
        return "".join(archive.read(n).decode(errors="replace") for n in archive.namelist() if n.endswith(".cpp"))


@pytest.mark.sweep  # 32 s of compiles; the default suite adds 35 s of generate and conversion tests (issue 22)
def test_static_cache_multi_token_decode_writes_the_callers_cache_in_place(model, plain, tmp_path):
    from transformers import StaticCache

    gen = static_config(model)
    # the micro-kernels compete with torch's mm by timing at compile (max_autotune): on an AVX-512 Xeon torch's mm
    # won for the tiny Llama's shapes, so the test leaves Inductor the micro-kernels only, where gemm="auto" asks
    # for autotuning (the prompt's and the plain forward's packages do not autotune: the option changes nothing there)
    config = AotiConfig(dynamic=True, inductor_configs={"max_autotune_gemm_backends": "CPP"})
    exported = AotiExporter().export_for_generation(model, CASE.inputs(2, 7), config,
                                                    generation_config=gen, multi_token_decode=True)
    # gemm="auto" (the default): the decode graph's linears run Inductor's GEMM micro-kernels on weights frozen into
    # its library; the prompt gets a package of its own calling torch's mm on weights kept outside, as gemm="aten" does
    decode, prefill = (exported.components[n].program for n in ("decode", "prefill"))
    assert decode is not prefill
    assert "micro_gemm" in _sources(decode.package) and not decode.weights
    for program in (prefill, plain.program):
        assert "micro_gemm" not in _sources(program.package) and program.weights
    exported.save_pretrained(tmp_path / "frozen")
    reloaded = ExportedModel.from_pretrained(tmp_path / "frozen", trust_remote_code=True)
    prompt = CASE.inputs(2, 9)
    expected = _eager_generate(model, prompt, gen)
    assert torch.equal(exported.generate(**prompt, max_new_tokens=24, min_new_tokens=24), expected)
    assert torch.equal(reloaded.generate(**prompt, max_new_tokens=24, min_new_tokens=24), expected)

    # the graph's cache write lands in the tensors the caller passed
    ids = prompt["input_ids"][:, :5]
    mask = torch.ones(2, 1, 5, gen.max_cache_len, dtype=torch.bool).tril(diagonal=0)
    kwargs = {"input_ids": ids, "position_ids": torch.arange(5).expand(2, 5), "attention_mask": mask}
    ours = StaticCache(config=model.config, max_cache_len=gen.max_cache_len)
    theirs = StaticCache(config=model.config, max_cache_len=gen.max_cache_len)
    with torch.no_grad():
        model(**kwargs, past_key_values=theirs, use_cache=True)
    runner = exported.runner("decode")
    runner(**kwargs, past_key_values=ours, use_cache=True)
    keys = ours.layers[0].keys
    runner(**{**kwargs, "input_ids": ids[:, :1], "position_ids": torch.full((2, 1), 5),
              "attention_mask": mask[:, :, :1]}, past_key_values=ours, use_cache=True)
    assert ours.layers[0].keys is keys  # the same tensor, written in place
    assert (ours.layers[0].keys[:, :, :5] - theirs.layers[0].keys[:, :, :5]).abs().max().item() <= 1e-5
    assert ours.layers[0].keys[:, :, 5].abs().sum().item() > 0  # the second call wrote position 5


def test_the_folder_stores_every_weight_once_outside_the_packages(model, generative, saved):
    names = sorted(p.name for p in saved.iterdir())
    assert {"prefill.pt2", "decode.pt2", WEIGHTS_NAME, "export.json"} <= set(names)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert weights <= (saved / WEIGHTS_NAME).stat().st_size <= 1.02 * weights + 8192  # tied weights once
    for name in ("prefill.pt2", "decode.pt2"):
        with zipfile.ZipFile(saved / name) as archive:  # no weight member; the library built without constants
            assert not [n for n in archive.namelist() if "/data/weights/" in n or "/data/constants/" in n]
        check_package(saved / name)
    manifest = json.loads((saved / "export.json").read_text())
    assert manifest["components"]["decode"]["files"] == ["decode.pt2", WEIGHTS_NAME]
    target = manifest["components"]["decode"]["metadata"]["compiled_for"]
    assert target["torch"] == torch.__version__ and target["march"] == "native" and "avx2" in target["cpu_flags"]


def test_a_trusted_reload_generates_the_same_tokens_on_one_copy_of_the_weights(model, saved):
    reloaded = ExportedModel.from_pretrained(saved, trust_remote_code=True)
    prefill, decode = (reloaded.components[n].program for n in ("prefill", "decode"))
    shared = set(prefill.weights) & set(decode.weights)
    assert shared and all(prefill.weights[k] is decode.weights[k] for k in shared)
    params = dict(model.named_parameters())
    assert all(torch.equal(v, params[k]) for k, v in decode.weights.items() if k in params)
    gen = static_config(model)
    gen.cache_implementation = None
    prompt = CASE.inputs(3, 6)
    assert torch.equal(reloaded.generate(**prompt, max_new_tokens=24, min_new_tokens=24),
                       _eager_generate(model, prompt, gen))


@pytest.fixture
def no_library_loads(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the package's library was loaded")

    monkeypatch.setattr(torch._inductor, "aoti_load_package", refuse)


def test_an_untrusted_folder_is_refused_before_its_library_loads(saved, no_library_loads):
    with pytest.raises(UnsupportedError, match="compiled machine code.*trust_remote_code=True"):
        ExportedModel.from_pretrained(saved)


@pytest.mark.parametrize("edit, message", [
    (lambda t: t["cpu_flags"].append("avx10_2"), r"-march=native on a CPU with avx10_2, which this CPU lacks"),
    (lambda t: t.update(torch="2.11.0+cpu"), r"built with torch 2\.11\.0\+cpu"),
    (lambda t: t.update(vector_isa="VecSVE256"), r"vector kernels are VecSVE256"),
    (lambda t: t.clear(), r"records no build target"),
], ids=["cpu-feature", "torch", "vector-isa", "no-record"])
def test_a_package_built_for_another_machine_is_refused_naming_why(saved, tmp_path, no_library_loads, edit, message):
    folder = tmp_path / "copy"
    shutil.copytree(saved, folder)
    manifest = json.loads((folder / "export.json").read_text())
    for entry in manifest["components"].values():
        edit(entry["metadata"]["compiled_for"])
    (folder / "export.json").write_text(json.dumps(manifest))
    with pytest.raises(UnsupportedError, match=message) as info:
        ExportedModel.from_pretrained(folder, trust_remote_code=True)
    assert "cannot run on this machine" in str(info.value)


def _with_member(source, target, name, data=b"x", link=False):
    shutil.copyfile(source, target)
    with zipfile.ZipFile(target, "a") as archive:
        info = zipfile.ZipInfo(name)
        if link:
            info.external_attr = (0o120777 << 16)
        archive.writestr(info, data)
    return target


@pytest.mark.parametrize("member, link, message", [
    ("{top}/../../evil.so", False, "would unzip outside"),
    ("/etc/cron.d/evil", False, "would unzip outside"),
    ("{top}/data/weights/weight_0", False, "not one AOTInductor writes"),
    ("{top}/data/aotinductor/model/second.wrapper.so", False, "2 shared libraries"),
    ("{top}/data/aotinductor/model/link.json", True, "symbolic link"),
    ("other/archive_format", False, "one top folder"),
], ids=["dotdot", "absolute", "weights-member", "second-library", "symlink", "second-top"])
def test_a_tampered_package_is_refused_naming_the_member(saved, tmp_path, member, link, message):
    with zipfile.ZipFile(saved / "decode.pt2") as archive:
        top = archive.namelist()[0].split("/")[0]
    path = _with_member(saved / "decode.pt2", tmp_path / "decode.pt2", member.format(top=top), link=link)
    with pytest.raises(ManifestError, match=message) as info:
        AotiExporter().load_program(path)
    assert "decode.pt2" in str(info.value)


def test_a_weights_header_without_the_package_is_refused(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "copy"
    shutil.copytree(saved, folder)
    save_file(load_file(str(saved / WEIGHTS_NAME)), str(folder / WEIGHTS_NAME), metadata={"prefill.pt2": "{}"})
    (folder / "export.json").unlink()  # the package checked alone (no manifest to compare sizes with)
    with pytest.raises(ManifestError, match=f"(?s){WEIGHTS_NAME}.*names no weights for decode.pt2"):
        AotiExporter().load_program(folder / "decode.pt2")


def test_config_problems_are_reported_before_tracing():
    with pytest.raises(ConfigError) as info:
        AotiConfig(inductor_configs={"aot_inductor.package_constants_in_so": True, "max_autotune": object()})
    text = str(info.value)
    assert "set by the exporter" in text and "max_autotune" in text and "not a JSON value" in text
    assert type(AutoHfExporter.from_config({"export_format": "aoti", "dynamic": True})) is AotiExporter


def test_no_compiler_is_a_clear_error_before_tracing(model, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setattr(torch.export, "export", lambda *a, **k: pytest.fail("traced without a compiler"))
    with pytest.raises(UnsupportedError, match="needs a C\\+\\+ compiler on PATH"):
        AotiExporter().export(model, CASE.inputs(2, 7), AotiConfig())


def test_the_command_line_loads_compiled_code_only_with_trust_remote_code(saved, capsys):
    from hfexport.cli import main
    from hfexport.cli.run import load_generation_export

    with pytest.raises(UnsupportedError, match="trust_remote_code=True"):
        load_generation_export(saved)
    exported, _ = load_generation_export(saved, trust_remote_code=True)
    assert set(exported.components) == {"prefill", "decode"}
    for command in ("run", "validate", "bench"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "--trust-remote-code" in capsys.readouterr().out, command
