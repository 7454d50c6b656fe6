"""The C++ zero-copy decode loop (examples/executorch_cpp) builds against the executorch wheel and, run on a tiny
Llama static-cache export with tied embedding / lm_head (its weights in decode.ptd), writes exactly eager
PyTorch's greedy tokens.

The export uses the spec's zero-copy config (``alloc_graph_input=False``, ``alloc_graph_output=False``,
``alloc_mutable_buffers=False``); the loop binds each mutated cache output onto its input buffer.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from hfexport import ExecutorchConfig
from hfexport.metadata import IORole
from hfexport.testing.tiny import TINY_CASES

executorch = pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "executorch_cpp"
PACKAGE = Path(executorch.__file__).parent if executorch.__file__ else Path(next(iter(executorch.__path__)))
CACHE_LEN = 32
NEW_TOKENS = 12


def _missing() -> str | None:
    """What the wheel or this machine lacks for the C++ build, or None."""
    needs = {
        "cmake": shutil.which("cmake"),
        "a C++ compiler (c++)": shutil.which("c++") or shutil.which("g++") or shutil.which("clang++"),
        "executorch's CMake package (share/cmake/executorch-config.cmake)":
            (PACKAGE / "share" / "cmake" / "executorch-config.cmake").exists() or None,
        "executorch's C++ headers (include/executorch/runtime/executor/method.h)":
            (PACKAGE / "include" / "executorch" / "runtime" / "executor" / "method.h").exists() or None,
        "the runtime library (lib/libexecutorch.so)": any((PACKAGE / "lib").glob("libexecutorch.*")) or None,
        "the XNNPACK delegate (lib/libexecutorch_backend_xnnpack.so)":
            any((PACKAGE / "lib").glob("libexecutorch_backend_xnnpack.*")) or None,
        "the CPU kernels (lib/libexecutorch_kernels_optimized.so)":
            any((PACKAGE / "lib").glob("libexecutorch_kernels_optimized.*")) or None,
    }
    missing = [name for name, found in needs.items() if not found]
    return f"cannot build the C++ decode loop, missing: {', '.join(missing)}" if missing else None


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    reason = _missing()
    if reason:
        pytest.skip(reason)
    build = tmp_path_factory.mktemp("cpp-build")
    env = {**os.environ, "CMAKE_BUILD_PARALLEL_LEVEL": "2"}
    subprocess.run(["cmake", "-S", str(EXAMPLE), "-B", str(build), f"-DCMAKE_PREFIX_PATH={PACKAGE}",
                    "-DCMAKE_BUILD_TYPE=Release"], check=True, capture_output=True, env=env)
    subprocess.run(["cmake", "--build", str(build)], check=True, capture_output=True, env=env)
    return build / "decode_loop"


@pytest.fixture(scope="module")
def zero_copy_export(tmp_path_factory):
    from hfexport.exporter_executorch import ExecutorchExporter

    case = TINY_CASES["llama"]
    model = case.build()
    model.config.tie_word_embeddings = True  # tied: the weights go to decode.ptd, which the loop loads too
    model.lm_head.weight = model.model.embed_tokens.weight
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample, gen.cache_implementation, gen.max_cache_len = False, "static", CACHE_LEN
    query = torch.export.Dim("query", min=1, max=CACHE_LEN)
    # the query axis varies (prompt, then one token); the cache keeps its size, so its method_meta shapes are exact
    config = ExecutorchConfig(
        dynamic_shapes={"input_ids": {1: query}, "position_ids": {1: query}, "attention_mask": {2: query}},
        alloc_graph_input=False, alloc_graph_output=False, alloc_mutable_buffers=False,
    )
    sample = {k: v[:1] for k, v in case.inputs(1, 6, padded=False).items()}
    exported = ExecutorchExporter().export_for_generation(model, sample, config, generation_config=gen,
                                                          multi_token_decode=True)
    directory = tmp_path_factory.mktemp("zero-copy")
    exported.save_pretrained(directory)
    return model, exported, directory / "decode.pte"


def _layout(metadata) -> list[str]:
    names = [s.name for s in metadata.inputs]
    mask = metadata.inputs[names.index("attention_mask")]
    assert len(mask.shape) == 4, f"the C++ loop builds a 4-d causal mask, the export takes {mask.shape}"
    binds = [f"{i}:{names.index(s.target)}" for i, s in enumerate(metadata.outputs) if s.role is IORole.MUTATION]
    logits = next(i for i, s in enumerate(metadata.outputs) if s.name == "logits")
    return ["--ids", str(names.index("input_ids")), "--positions", str(names.index("position_ids")),
            "--mask", str(names.index("attention_mask")), "--logits", str(logits), "--bind", ",".join(binds)]


def test_cpp_decode_loop_writes_eager_greedy_tokens(binary, zero_copy_export):
    model, exported, pte = zero_copy_export
    assert pte.with_suffix(".ptd").exists(), "a tied model's weights are stored once, in decode.ptd"
    metadata = exported.components["decode"].metadata
    assert sum(s.role is IORole.MUTATION for s in metadata.outputs) == 6  # K, V, counter of both layers, in place
    prompt = TINY_CASES["llama"].inputs(1, 7, padded=False)["input_ids"]
    with torch.no_grad():
        expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW_TOKENS,
                                  do_sample=False)
    result = subprocess.run(
        [str(binary), str(pte), *_layout(metadata), "--prompt", ",".join(map(str, prompt[0].tolist())),
         "--new-tokens", str(NEW_TOKENS)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    tokens = [int(t) for t in result.stdout.strip().splitlines()[-1].split(",")]
    assert tokens == expected[0].tolist()
