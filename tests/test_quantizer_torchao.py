"""torchao-8da4w: torchao's ``quantize_`` on a copy of the eager model before the trace, lowered by ExecuTorch's
XNNPACK partitioner into its qd8-f32-qb4w fully-connected (int8 dynamic activations, 4-bit weights in groups of 32).

The contract (a quantized copy per component, the user's model untouched, other formats refused) is checked without
exporting; one ExecuTorch export of the tiny Llama (static cache, multi-token decode: the deployed recipe) is shared
by the checks of what it lowered to, its size, its logits and its generation. SmolLM2's figures are in
benchmarks/RESULTS_QUANTIZED.md.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from hfexport import ExportFormat, UnsupportedError
from hfexport.quantizers.base import ExportQuantizer
from hfexport.quantizers.presets import recipe
from hfexport.testing.tiny import TINY_CASES

pytest.importorskip("torchao", reason="torchao-8da4w needs torchao")

PROMPT_LEN = 8
STEPS = 32


@pytest.fixture(scope="module")
def llama():
    return TINY_CASES["llama"].build()


def _plain(model):
    return {name: p.detach().clone() for name, p in model.named_parameters(remove_duplicate=False)}


@pytest.mark.parametrize("fmt", ["dynamo", "onnx", "openvino", "aoti"])
def test_other_formats_are_refused_with_what_to_use_instead(fmt):
    with pytest.raises(UnsupportedError, match=r"quantizes 'executorch' exports.*'ort-int4'.*'nncf-int4'"):
        recipe("torchao-8da4w", fmt)
    assert recipe("torchao-8da4w", "executorch").quantizes_module


def test_quantize_module_returns_a_quantized_copy_and_leaves_the_model_alone(llama):
    from torchao.quantization import IntxUnpackedToInt8Tensor

    before = _plain(llama)
    quantizer = recipe("torchao-8da4w", "executorch")
    quantized = quantizer.quantize_module(llama, {}, ExportFormat.EXECUTORCH)

    assert quantized is not llama
    after = _plain(llama)
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(type(p) is torch.nn.Parameter and type(p.data) is torch.Tensor for p in llama.parameters())

    linears = {n: m for n, m in quantized.named_modules() if isinstance(m, torch.nn.Linear)}
    for name, module in linears.items():
        weight = module.weight
        assert isinstance(weight, IntxUnpackedToInt8Tensor), name
        bits = _bits(name)
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        assert low <= int(weight.qdata.min()) and int(weight.qdata.max()) <= high, name
        if bits == 4:  # one scale per group of 32 input columns
            assert tuple(weight.scale.shape) == (weight.shape[0], weight.shape[1] // 32), name
    embedding = quantized.model.embed_tokens.weight
    assert isinstance(embedding, IntxUnpackedToInt8Tensor) and int(embedding.qdata.abs().max()) > 8  # int8 rows

    ids = TINY_CASES["llama"].inputs(1, PROMPT_LEN, padded=False)["input_ids"]
    with torch.no_grad():
        fp32, q = llama(input_ids=ids).logits, quantized(input_ids=ids).logits
    # the quantized copy computes something close to, but not the same as, the fp32 model
    assert 0 < float((q - fp32).abs().max()) < 0.25 * float(fp32.abs().max())


def test_layers_that_do_not_fit_the_groups_or_are_excluded_stay_float():
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, PerGroup

    from hfexport.quantizers.torchao import TorchAOQuantizer

    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 48), torch.nn.Linear(48, 8))
    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32))
    quantizer = TorchAOQuantizer(config, module_configs={r"^1$": None})
    assert list(quantizer.plan(model)) == ["0"]  # "1" excluded, "2": 48 input columns are not groups of 32
    quantized = quantizer.quantize_module(model, {}, ExportFormat.EXECUTORCH)
    assert type(quantized[0].weight).__name__ == "IntxUnpackedToInt8Tensor"
    assert type(quantized[1].weight.data) is torch.Tensor and type(quantized[2].weight.data) is torch.Tensor
    assert quantizer.with_calibration([{"input_ids": None}]) is quantizer  # data-free
    assert quantizer.to_dict()["module_configs"] == {r"^1$": None}


def test_float_zero_points_keep_a_q4_1_grid_that_symmetric_int4_loses():
    """A weight on llama.cpp's Q4_1 grid (per group of 32 inputs, q * d + m with a float offset m): with
    float_zero_points the linear becomes a GroupOffsetLinear, symmetric 4-bit codes with HQQ's scales in torchao's
    tensor plus the groups' float offsets, and its weight comes back almost exactly; the symmetric int4 of the same
    config (HQQ's scale-only fit) cannot hold the offsets."""
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxUnpackedToInt8Tensor, PerGroup

    from hfexport.quantizers.torchao import TorchAOQuantizer
    from hfexport.quantizers.torchao_offsets import GroupOffsetLinear

    generator = torch.Generator().manual_seed(0)
    source = torch.randn(64, 4, 32, generator=generator) * 0.05
    low, high = source.amin(-1, keepdim=True), source.amax(-1, keepdim=True)
    d, m = ((high - low) / 15).half().float(), low.half().float()
    weight = (((source - m) / d).round().clamp(0, 15) * d + m).reshape(64, 128)
    model = torch.nn.Sequential(torch.nn.Linear(128, 64, bias=False))
    with torch.no_grad():
        model[0].weight.copy_(weight)
    config = Int8DynamicActivationIntxWeightConfig(weight_dtype=torch.int4, weight_granularity=PerGroup(32),
                                                   intx_choose_qparams_algorithm="hqq_scale_only")
    split = TorchAOQuantizer(config, float_zero_points=True).quantize_module(model, {}, ExportFormat.EXECUTORCH)
    plain = TorchAOQuantizer(config).quantize_module(model, {}, ExportFormat.EXECUTORCH)
    assert isinstance(split[0], GroupOffsetLinear) and not isinstance(plain[0], GroupOffsetLinear)
    codes = split[0].linear.weight
    assert isinstance(codes, IntxUnpackedToInt8Tensor) and -8 <= int(codes.qdata.min()) <= int(codes.qdata.max()) <= 7
    assert int(codes.zero_point.abs().max()) == 0  # symmetric: what XNNPACK's qb4w kernel takes
    offsets = split[0].offsets.repeat_interleave(32, dim=1)
    split_error = float((codes.dequantize() + offsets - weight).abs().max())
    plain_error = float((plain[0].weight.dequantize() - weight).abs().max())
    assert split_error * 20 < plain_error, (split_error, plain_error)
    x = torch.randn(3, 128, generator=generator)
    with torch.no_grad():  # the forward adds the offsets (its input quantized to int8 per token in both)
        exact = x @ weight.T
        assert float((split(x) - exact).abs().max()) * 3 < float((plain(x) - exact).abs().max())
    assert TorchAOQuantizer(config, float_zero_points=True).to_dict()["float_zero_points"] is True
    # an embedding tied to the split linear keeps its float table
    tied = torch.nn.ModuleDict({"embed": torch.nn.Embedding(64, 128), "head": torch.nn.Linear(128, 64, bias=False)})
    tied["embed"].weight = tied["head"].weight = torch.nn.Parameter(weight.clone())
    copied = TorchAOQuantizer(config, float_zero_points=True).quantize_module(tied, {}, ExportFormat.EXECUTORCH)
    assert isinstance(copied["head"], GroupOffsetLinear) and torch.equal(copied["embed"].weight, weight)


class _ZeroLmHead(ExportQuantizer):
    """A quantizer of the eager module that zeroes the lm_head of its copy, counting its calls."""

    supported_formats = (ExportFormat.DYNAMO,)
    quantizes_module = True

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def quantize_module(self, module, sample_inputs, export_format):
        self.calls.append(type(module).__name__)
        copied = copy.deepcopy(module)
        with torch.no_grad():
            copied.lm_head.weight.zero_()
        return copied


def test_the_exporter_traces_a_quantized_copy_of_every_component(llama):
    from hfexport import DynamoConfig, DynamoExporter

    case = TINY_CASES["llama"]
    before = _plain(llama)
    quantizer = _ZeroLmHead()
    exporter = DynamoExporter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = exporter.export_for_generation(
            llama, case.inputs(1, 5, padded=False), DynamoConfig(dynamic=True, quantizer=quantizer)
        )
    assert len(quantizer.calls) == 2  # the prefill graph and the decode graph, each traced from its own copy
    assert [t.component for t in exporter.stage_timings if t.stage == "quantize"] == ["decode", "prefill"]
    after = _plain(llama)
    assert all(torch.equal(before[k], after[k]) for k in before)
    out = exported.generate(**case.inputs(1, 5, padded=False), max_new_tokens=2, output_logits=True,
                            return_dict_in_generate=True)
    assert all(float(step.abs().max()) == 0 for step in out.logits)  # the graphs are the zeroed copy's


# --- one ExecuTorch export of the tiny Llama with the recipe -----------------------------------------------------


@pytest.fixture(scope="module")
def one_layer():
    """The tiny Llama with one decoder layer: ExecuTorch lowers each 8da4w linear as a delegate of its own, and the
    two-layer model's lowering takes ~80 s on two busy cores (the fp32 one ~25 s)."""
    from transformers import LlamaForCausalLM

    from hfexport.testing.tiny_multimodal import instantiate

    config = copy.deepcopy(TINY_CASES["llama"].build().config)
    config.num_hidden_layers = 1
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:1]
    return instantiate(LlamaForCausalLM, config)


@pytest.fixture(scope="module")
def executorch_8da4w(one_layer, tmp_path_factory):
    pytest.importorskip("executorch", reason="the ExecuTorch backend needs the executorch package")
    from transformers import GenerationConfig

    from hfexport import ExecutorchConfig, ExportedModel
    from hfexport.exporter_executorch import ExecutorchExporter

    case = TINY_CASES["llama"]
    config = ExecutorchConfig(dynamic=True, quantizer=recipe("torchao-8da4w", "executorch"))
    generation = GenerationConfig(cache_implementation="static", max_cache_len=96)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = ExecutorchExporter().export_for_generation(
            one_layer, case.inputs(1, 5, padded=False), config, generation_config=generation, multi_token_decode=True
        )
    folder = tmp_path_factory.mktemp("torchao-8da4w")
    exported.save_pretrained(folder)
    return exported, ExportedModel.from_pretrained(folder), folder


def _delegated_nodes(lowered) -> list[list[torch.fx.Node]]:
    """The call nodes inside each delegate of an ExecuTorch program (the partition it was given)."""
    program = lowered.exported_program()
    out = []
    for _, module in program.graph_module.named_children():
        original = getattr(module, "original_module", None)
        if original is not None:
            out.append([n for n in original.graph.nodes if n.op == "call_function"])
    return out


def _dynamic_linear_bits(nodes: list[torch.fx.Node]) -> int | None:
    """The weight bits of a partition of one linear whose input is quantized to int8 at run time
    (``choose_qparams_affine``, dequantized from [-128, 127]) and whose weight is dequantized from [-8, 7] (4) or
    [-128, 127] (8); else None."""
    names = [str(n.target) for n in nodes]
    if not (any("linear" in t for t in names) and any("choose_qparams_affine" in t for t in names)):
        return None
    ranges = {tuple(n.args[5:7]) for n in nodes if "dequantize_affine" in str(n.target)}  # input's and weight's
    return 4 if (-8, 7) in ranges else 8 if ranges == {(-128, 127)} else None


def test_linears_run_in_xnnpack_as_int8_activations_times_int4_weights(executorch_8da4w, one_layer):
    from hfexport.tools.measure import fp32_weight_bytes

    exported, _, folder = executorch_8da4w
    assert exported.components["prefill"].program is exported.components["decode"].program  # one .pte
    program = exported.components["decode"].program
    outside = [str(n.target) for n in program.exported_program().graph.nodes if n.op == "call_function"]
    assert not [op for op in outside if "linear" in op or "mm" in op or "torchao" in op], outside
    assert any("embedding_byte" in op for op in outside)  # the int8 embedding, ExecuTorch's quantized kernel
    assert any("custom_sdpa" in op for op in outside)  # the static cache's fast attention, as in the fp32 export

    # every linear is a delegate of its own: run-time int8 quantization of its input (choose_qparams) and a 4-bit
    # weight (dequantize_affine over [-8, 7]) around the linear, which XNNPACK runs as one qd8-f32-qb4w kernel
    # (8-bit weights over [-128, 127], qd8-f32-qc8w, for the lm_head and the MLP down projections)
    linears = [name for name, m in one_layer.named_modules() if isinstance(m, torch.nn.Linear)]
    bits = sorted(b for b in map(_dynamic_linear_bits, _delegated_nodes(program)) if b is not None)
    assert bits == sorted(_bits(name) for name in linears)  # 4-bit (qb4w), and 8-bit for the lm_head / down_proj

    pte = sum(f.stat().st_size for f in folder.glob("*.pt[ed]"))
    # measured 0.33x (4-bit linears, the lm_head and down_proj 8-bit, int8 embedding); the fp32 .pte is 1.1x the fp32
    # weights
    assert pte < 0.4 * fp32_weight_bytes(one_layer), pte


def test_logits_match_the_quantized_model_and_stay_near_fp32(executorch_8da4w, one_layer):
    _, reloaded, _ = executorch_8da4w
    case = TINY_CASES["llama"]
    inputs = case.inputs(1, PROMPT_LEN, padded=False)
    quantized = recipe("torchao-8da4w", "executorch").quantize_module(one_layer, {}, ExportFormat.EXECUTORCH)
    with torch.no_grad():
        fp32 = one_layer.generate(**inputs, max_new_tokens=1, output_logits=True, return_dict_in_generate=True)
        eager = quantized.generate(**inputs, max_new_tokens=1, output_logits=True, return_dict_in_generate=True)
    got = reloaded.generate(**inputs, max_new_tokens=1, output_logits=True, return_dict_in_generate=True)
    scale = float(fp32.logits[0].abs().max())
    # XNNPACK computes the eager torchao model's arithmetic: measured 0.0075 of the fp32 logits' largest magnitude;
    # the quantized weights move them from fp32 by 0.062 of it
    assert float((got.logits[0] - eager.logits[0]).abs().max()) < 0.03 * scale
    assert 0.03 * scale < float((got.logits[0] - fp32.logits[0]).abs().max()) < 0.3 * scale


def test_generate_keeps_eager_top1_through_the_decode_loop(executorch_8da4w, one_layer):
    from hfexport.tools.measure import eager_greedy, top1_agreement

    _, reloaded, _ = executorch_8da4w
    case = TINY_CASES["llama"]
    prompt = case.inputs(1, PROMPT_LEN, padded=False)
    quantized = recipe("torchao-8da4w", "executorch").quantize_module(one_layer, {}, ExportFormat.EXECUTORCH)
    fp32 = eager_greedy(one_layer, prompt["input_ids"], STEPS)
    eager = eager_greedy(quantized, prompt["input_ids"], STEPS)
    # teacher-forced through the export's own prefill + decode loop: the fp32 model's tokens measured 0.875 (random
    # weights: flat logits, near ties the 4-bit weights flip), the eager quantized model's 0.97; an unquantized
    # export keeps 1.0, garbage ~1/256
    assert top1_agreement(reloaded, fp32, PROMPT_LEN) >= 0.6
    assert top1_agreement(reloaded, eager, PROMPT_LEN) >= 0.9
    generated = reloaded.generate(**prompt, max_new_tokens=STEPS, do_sample=False)
    assert generated.shape[-1] == PROMPT_LEN + STEPS
    assert top1_agreement(reloaded, generated, PROMPT_LEN) == 1.0  # generate's picks are its decode loop's argmax
    # and the eager quantized model's greedy tokens: measured the same for (at least) the first 18 of 32
    assert torch.equal(generated[0, : PROMPT_LEN + 12], eager[0, : PROMPT_LEN + 12])


def _bits(name: str) -> int:
    """The weight bits the recipe gives the linear ``name`` (hfexport.quantizers.presets)."""
    from hfexport.quantizers import presets

    if name.endswith("lm_head"):
        return {"int4": 4, "int8": 8}[presets.TORCHAO_LM_HEAD]
    return 8 if name.endswith("mlp.down_proj") and presets.TORCHAO_INT8_DOWN else 4
