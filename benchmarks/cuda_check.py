"""GPU checks of hfexport's CUDA paths on the tiny Llama: one process, each step guarded, one JSON line per step.

    PYTHONPATH=src python benchmarks/cuda_check.py        # on a CUDA machine; results in $OUT/results.json
    DEV=cpu PYTHONPATH=src python benchmarks/cuda_check.py  # a dry run of the script's own logic on the CPU

Steps: Dynamo exported on the GPU (forward, reload with device="cuda"), a CPU export moved to the GPU, generate() on
the GPU with a dynamic and a static cache (tokens against eager's, and the tiny model's tokens/s, i.e. per-step
overhead), ONNX Runtime with device="cuda", ExecuTorch backend="cuda" (forward, static-cache generation, bfloat16).
Results of the last run: benchmarks/RESULTS_CUDA.md.
"""

import copy
import json
import os
import sys
import time
import traceback
import warnings

warnings.simplefilter("ignore")
import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
OUT = os.environ.get("OUT", "/tmp/out")
DEV = os.environ.get("DEV", "cuda")
os.makedirs(OUT, exist_ok=True)
RESULTS = {}


def step(name):
    def deco(fn):
        t = time.time()
        try:
            RESULTS[name] = {"ok": True, "out": fn()}
        except BaseException as e:  # noqa: BLE001
            RESULTS[name] = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:1500]}",
                             "tb": traceback.format_exc()[-2500:]}
        RESULTS[name]["s"] = round(time.time() - t, 1)
        print("STEP", name, json.dumps(RESULTS[name], default=str), flush=True)
        with open(os.path.join(OUT, "results.json"), "w") as f:
            json.dump(RESULTS, f, default=str, indent=1)
        if DEV == "cuda":
            torch.cuda.synchronize()
        return fn
    return deco


@step("env")
def _():
    import importlib.metadata as md
    v = {}
    for n in ("torch", "transformers", "onnxruntime", "onnx", "onnx-ir", "onnxscript", "executorch", "torchao",
              "triton", "huggingface_hub"):
        try:
            v[n] = md.version(n)
        except Exception:
            v[n] = None
    import onnxruntime as ort
    return {"versions": v, "gpu": torch.cuda.get_device_name(0) if DEV == "cuda" else None, "ort_providers": ort.get_available_providers()}


from hfexport import (AutoExportConfig, AutoHfExporter, DynamoConfig, ExecutorchConfig, ExportedModel,  # noqa: E402
                      UnsupportedError)
from hfexport.exporter_dynamo import DynamoExporter  # noqa: E402
from hfexport.testing.tiny import tiny_inputs, tiny_model  # noqa: E402

torch.manual_seed(0)
MODEL = tiny_model("llama").eval()
CUDA_MODEL = copy.deepcopy(MODEL).to(DEV)
INPUTS = tiny_inputs("llama", batch=2, seq=7)
CUDA_INPUTS = {k: v.to(DEV) for k, v in INPUTS.items()}
with torch.no_grad():
    EAGER = CUDA_MODEL(**CUDA_INPUTS).logits


def sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def _diff(out):
    logits = out.logits if hasattr(out, "logits") else out
    assert logits.device.type == DEV, logits.device
    return float((logits - EAGER).abs().max())


def _gen_config(model, static):
    gen = copy.deepcopy(model.generation_config)
    gen.do_sample = False
    if static:
        gen.cache_implementation, gen.max_cache_len = "static", 128
    return gen


def _generate_check(exported, model, static):
    prompt = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(3)).to(DEV)
    mask = torch.ones_like(prompt)
    with torch.no_grad():
        expected = model.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=16,
                                  generation_config=_gen_config(model, static))
    got = exported.generate(input_ids=prompt, attention_mask=mask, max_new_tokens=16)
    from_cpu = exported.generate(input_ids=prompt.cpu(), attention_mask=mask.cpu(), max_new_tokens=16)
    return {"equal": bool(torch.equal(got.cpu(), expected.cpu())), "cpu_prompt_equal": bool(torch.equal(from_cpu.cpu(), expected.cpu())), "got": got.tolist(), "eager": expected.tolist(),
            "device": str(got.device)}


@step("dynamo_export_on_cuda_forward")
def _():
    exported = DynamoExporter().export(CUDA_MODEL, dict(CUDA_INPUTS), DynamoConfig(dynamic=True))
    out = exported(**CUDA_INPUTS)
    exported.save_pretrained("/tmp/dyn_cuda")
    reloaded = ExportedModel.from_pretrained("/tmp/dyn_cuda", device=DEV)
    return {"max_abs_diff": _diff(out), "reloaded_diff": _diff(reloaded(**CUDA_INPUTS))}


@step("dynamo_cpu_export_moved_to_cuda")
def _():
    exported = DynamoExporter().export(MODEL, dict(INPUTS), DynamoConfig(dynamic=True))
    exported.save_pretrained("/tmp/dyn_cpu")
    moved = ExportedModel.from_pretrained("/tmp/dyn_cpu", device=DEV)
    return {"cuda_inputs_diff": _diff(moved(**CUDA_INPUTS)), "cpu_inputs_diff": _diff(moved(**INPUTS))}


for static in (False, True):
    @step(f"dynamo_generate_cuda_{'static' if static else 'dynamic'}")
    def _(static=static):
        config = AutoExportConfig.from_dict({"export_format": "dynamo", "dynamic": True})
        exported = AutoHfExporter.from_config(config).export_for_generation(
            CUDA_MODEL, dict(CUDA_INPUTS), config, generation_config=_gen_config(CUDA_MODEL, static))
        result = {"spec_devices": {n: {s.name: s.device for s in c.metadata.inputs if s.device}
                                   for n, c in exported.components.items()}}
        result.update(_generate_check(exported, CUDA_MODEL, static))
        # decode speed of the tiny model, exported vs eager, on the GPU (per-step overhead, not kernels)
        prompt = torch.randint(0, 128, (1, 9)).to(DEV)
        for label, fn in (("eager", lambda: CUDA_MODEL.generate(input_ids=prompt, max_new_tokens=64, min_new_tokens=64,
                                                                   generation_config=_gen_config(CUDA_MODEL, static))),
                          ("exported", lambda: exported.generate(input_ids=prompt, max_new_tokens=64))):
            fn()
            sync()
            t = time.perf_counter()
            fn()
            sync()
            result[f"{label}_tok_s"] = round(64 / (time.perf_counter() - t), 1)
        return result


@step("onnx_cuda")
def _():
    import onnxruntime as ort
    from hfexport import OnnxConfig
    from hfexport.exporter_onnx import OnnxExporter
    exported = OnnxExporter().export(MODEL, dict(INPUTS), OnnxConfig(dynamic=True))
    try:
        moved = exported.to(DEV)
    except UnsupportedError as e:
        return {"refused": str(e), "providers": ort.get_available_providers()}
    return {"diff": _diff(moved(**CUDA_INPUTS))}


def _et_files(path):
    return {f: os.path.getsize(os.path.join(path, f)) for f in sorted(os.listdir(path))}


@step("executorch_cuda_forward")
def _():
    from hfexport.backends.executorch import ExecutorchExporter
    exported = ExecutorchExporter().export(CUDA_MODEL, dict(CUDA_INPUTS), ExecutorchConfig(backend="cuda"))
    path = "/tmp/et_cuda"
    exported.save_pretrained(path)
    result = {"files": _et_files(path)}
    try:
        ExportedModel.from_pretrained(path)(**INPUTS)
    except BaseException as e:  # noqa: BLE001
        result["reload_run_error"] = f"{type(e).__name__}: {str(e)[:600]}"
    try:
        out = exported(**INPUTS)
        logits = out.logits if hasattr(out, "logits") else out
        result["diff"] = float((logits.to(EAGER.device) - EAGER).abs().max())
    except BaseException as e:  # noqa: BLE001
        result["run_error"] = f"{type(e).__name__}: {str(e)[:1500]}"
    return result


@step("executorch_cuda_generation_static")
def _():
    config = ExecutorchConfig(backend="cuda")
    from hfexport.backends.executorch import ExecutorchExporter
    exported = ExecutorchExporter().export_for_generation(
        CUDA_MODEL, dict(CUDA_INPUTS), config, generation_config=_gen_config(CUDA_MODEL, True))
    path = "/tmp/et_cuda_gen"
    exported.save_pretrained(path)
    result = {"files": _et_files(path)}
    try:
        result.update(_generate_check(exported, CUDA_MODEL, True))
    except BaseException as e:  # noqa: BLE001
        result["run_error"] = f"{type(e).__name__}: {str(e)[:1500]}"
    return result

@step("executorch_cuda_bf16_forward")
def _():
    from hfexport.backends.executorch import ExecutorchExporter
    model = copy.deepcopy(MODEL).to(torch.bfloat16).to(DEV)
    exported = ExecutorchExporter().export(model, dict(CUDA_INPUTS), ExecutorchConfig(backend="cuda"))
    exported.save_pretrained("/tmp/et_cuda_bf16")
    return {"files": _et_files("/tmp/et_cuda_bf16")}


print("DONE", json.dumps({k: v["ok"] for k, v in RESULTS.items()}))
