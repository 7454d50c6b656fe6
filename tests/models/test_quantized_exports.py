"""Each quantization recipe on each format it serves, on the tiny Llama: the export runs after a reload from disk,
its weight bytes on disk shrink against the fp32 model's, and its greedy top-1 agreement with eager PyTorch over 64
decode steps (teacher-forced on eager's tokens) is measured and bounded.

The tiny Llama's embedding is 15 % of its weights: a recipe that leaves it in fp32 cannot get under ~0.37x here.
SmolLM2's figures (the 0.35x / 0.2x size targets, >= 90 % int8 agreement) are in benchmarks/RESULTS_QUANTIZED.md.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from hfexport import AutoExportConfig, AutoHfExporter, ExportedModel
from hfexport.testing.tiny import TINY_CASES
from hfexport.tools.measure import eager_greedy, fp32_weight_bytes, top1_agreement, weight_bytes
from hfexport.quantizers.presets import recipe

STEPS = 64
PROMPT_LEN = 8

# (recipe, format) -> (max weight-bytes ratio vs fp32, min top-1 agreement): what each pair reaches here, with a
# margin.
PAIRS = {
    ("pt2e-int8", "dynamo"): (0.35, 0.75),
    ("pt2e-int8", "onnx"): (0.35, 0.75),
    ("pt2e-int8", "openvino"): (0.35, 0.75),  # measured 0.264 (the embedding int8 too)
    ("pt2e-int8", "executorch"): (0.5, 0.75),  # the whole .pte + .ptd; measured 0.454 (embedding int8 weight-only)
    ("ort-dynamic", "onnx"): (0.35, 0.75),
    ("ort-static", "onnx"): (0.35, 0.75),
    ("nncf-int8", "onnx"): (0.35, 0.75),
    ("nncf-int8", "openvino"): (0.35, 0.75),
    ("nncf-int8", "dynamo"): (0.35, 0.75),
    ("nncf-int8", "executorch"): (0.55, 0.75),
    ("nncf-int8-weights", "openvino"): (0.35, 0.75),
    ("nncf-int4", "onnx"): (0.25, 0.6),
    ("nncf-int4", "openvino"): (0.25, 0.6),  # AWQ + scale estimation on the calibration samples
    ("nncf-int4", "dynamo"): (0.25, 0.6),
    ("hqq-int4", "openvino"): (0.25, 0.6),
    ("int8-groups", "openvino"): (0.35, 0.75),
}
# one pair per backend-model quantizer family in the default suite; the rest with `make test-sweep`
DEFAULT = {("pt2e-int8", "dynamo"), ("ort-dynamic", "onnx"), ("nncf-int8", "openvino")}


# (recipe, format) -> the upstream limitation that stops it
FAILS = {
    # passed (0.43x, 95.3 %) when run after nncf-int8-dynamo; failed when run after pt2e-int8-executorch in the same
    # process: state left behind by one of the two, not understood yet
    ("nncf-int8", "executorch"): "executorch 1.5.1 XNNPACK ConvertToLinearPass fails on the linear of an NNCF 3.4 "
    "TorchFX compressed weight ('t() expects a tensor with <= 2 dimensions, but self is 3D') in some runs",
}


def _params():
    for pair in PAIRS:
        marks = [] if pair in DEFAULT else [pytest.mark.sweep]
        if pair in FAILS:
            marks.append(pytest.mark.xfail(reason=FAILS[pair], strict=False))
        yield pytest.param(*pair, marks=marks, id=f"{pair[0]}-{pair[1]}")


@pytest.fixture(scope="module")
def llama():
    case = TINY_CASES["llama"]
    model = case.build()
    prompt = case.inputs(1, PROMPT_LEN, padded=False)["input_ids"]
    sequence = eager_greedy(model, prompt, STEPS)
    calibration = [case.inputs(1, 6 + 2 * i, padded=False) for i in range(4)]
    return case, model, sequence, calibration


@pytest.mark.parametrize("name,fmt", list(_params()))
def test_quantized_export_runs_shrinks_and_agrees(name, fmt, llama, tmp_path):
    case, model, sequence, calibration = llama
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    config.quantizer = recipe(name, fmt, calibration)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = AutoHfExporter.from_config(config).export(model, case.inputs(2, 7), config)
    exported.save_pretrained(tmp_path)
    reloaded = ExportedModel.from_pretrained(tmp_path)

    ratio = weight_bytes(tmp_path) / fp32_weight_bytes(model)
    agreement = top1_agreement(reloaded, sequence, PROMPT_LEN)
    print(f"\n{name} x {fmt}: weight bytes {ratio:.3f}x of fp32, top-1 agreement {agreement:.1%} over {STEPS} steps")
    max_ratio, min_agreement = PAIRS[(name, fmt)]
    assert ratio <= max_ratio, f"{name} x {fmt}: weights {ratio:.3f}x of fp32 (bound {max_ratio})"
    assert agreement >= min_agreement, f"{name} x {fmt}: top-1 agreement {agreement:.1%}"
    # the quantized graph, not a float copy, is what runs: its logits differ from the fp32 model's a little
    inputs = sequence[:, :-1]
    with torch.no_grad():
        eager = model(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits
    got = reloaded(input_ids=inputs, attention_mask=torch.ones_like(inputs)).logits
    diff = float((got - eager).abs().max())
    assert 0 < diff < 0.5 * float(eager.abs().max()), diff


def test_generation_export_agreement_runs_its_own_prefill_and_decode_graphs(llama, monkeypatch):
    """top1_agreement on an export_for_generation result: the prefill graph on the prompt, then one decode-graph call
    per step fed the given token. An fp32 export keeps every one of eager's greedy tokens; fed a random continuation,
    each step's argmax is eager's argmax after the same tokens (a feed off by one position would break that) and
    the score counts the misses; the decode graph runs STEPS - 1 times."""
    from hfexport.tools.measure import _forced_decode

    case, model, sequence, _ = llama
    config = AutoExportConfig.from_dict({"export_format": "dynamo", "dynamic": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = AutoHfExporter.from_config(config).export_for_generation(model, case.inputs(2, 7), config)
    decode = exported.runner("decode")
    calls = []
    original = type(decode).__call__
    monkeypatch.setattr(type(decode), "__call__", lambda self, *a, **k: (calls.append(self), original(self, *a, **k))[1])
    assert top1_agreement(exported, sequence, PROMPT_LEN) == 1.0
    assert sum(c is decode for c in calls) == STEPS - 1

    generator = torch.Generator().manual_seed(3)
    random = torch.randint(3, model.config.vocab_size, (1, STEPS), generator=generator)
    forced = torch.cat([sequence[:, :PROMPT_LEN], random], dim=-1)
    with torch.no_grad():
        expected = model(input_ids=forced[:, :-1]).logits[:, PROMPT_LEN - 1 :].argmax(-1)
    assert torch.equal(_forced_decode(exported, forced, PROMPT_LEN), expected)
    assert top1_agreement(exported, forced, PROMPT_LEN) < 0.2


def test_quantized_generation_export_agrees_through_its_decode_graph(llama, tmp_path):
    """ort-dynamic on a dynamic-cache ONNX export (prefill + decode): the two graphs share the int8 weights on disk,
    and the decode loop teacher-forced on eager's tokens keeps eager's top-1 as the single graph does."""
    case, model, sequence, calibration = llama
    config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})
    config.quantizer = recipe("ort-dynamic", "onnx", calibration)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = AutoHfExporter.from_config(config).export_for_generation(model, case.inputs(2, 7), config)
    exported.save_pretrained(tmp_path)
    reloaded = ExportedModel.from_pretrained(tmp_path)
    assert weight_bytes(tmp_path) / fp32_weight_bytes(model) <= 0.35
    assert top1_agreement(reloaded, sequence, PROMPT_LEN) >= 0.75


# --- MatMulNBits (ort-int8 / ort-int4) on the fused graph the ONNX decode-speed rows deploy ----------------------


def _fused_static_export(model, case, quantizer):
    import copy

    from hfexport import OnnxConfig

    generation = copy.deepcopy(model.generation_config)
    generation.cache_implementation, generation.max_cache_len = "static", 96
    config = OnnxConfig(dynamic=True, ort_fusions="cpu", quantizer=quantizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoHfExporter.from_config(config).export_for_generation(
            model, case.inputs(1, 5, padded=False), config, generation_config=generation, multi_token_decode=True
        )


@pytest.mark.parametrize(
    "name,bits,block,max_ratio",
    [("ort-int4", 4, 32, 0.25), pytest.param("ort-int8", 8, 16, 0.36, marks=pytest.mark.sweep)],
)
def test_matmul_nbits_quantizes_every_weight_and_keeps_the_fused_attention(name, bits, block, max_ratio, llama,
                                                                           tmp_path):
    """ort-int4 / ort-int8 on a static-cache, multi-token-decode export fused for ONNX Runtime's CPU kernels: every
    MatMul with a constant weight (the packed QKV and gate/up, o_proj, down_proj) is a MatMulNBits of that many bits
    in blocks of 32 (int4) or 16 (int8) with accuracy_level 4, symmetric (the fast kernel), the lm_head one of 8 bits;
    at 4 bits each of the others also has its HQQ block offsets as a MatMul of its input's block sums ([K / 32, N]);
    the embedding an int8 table gathered before dequantizing; GroupQueryAttention is still there; the saved weights
    shrink; the export's own decode loop keeps eager's top-1."""
    import onnx

    case, model, sequence, _ = llama
    exported = _fused_static_export(model, case, recipe(name, "onnx"))
    exported.save_pretrained(tmp_path)
    (path,) = [p for p in tmp_path.glob("*.onnx")]
    graph = onnx.load(str(path), load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    ops = [n.op_type for n in graph.node]
    layers = model.config.num_hidden_layers
    assert ops.count("GroupQueryAttention") == layers
    producers = {o: n for n in graph.node for o in n.output}
    float_products = [n for n in graph.node if n.op_type in ("MatMul", "FusedMatMul") and n.input[1] in initializers]
    assert all(producers[n.input[0]].op_type == "ReduceSum" for n in float_products)  # only block offsets
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    assert len(nbits) == 4 * layers + 1  # packed qkv, o_proj, packed gate/up, down_proj; lm_head
    assert len(float_products) == (4 * layers if bits == 4 else 0)
    shapes = {i.name: list(i.dims) for i in graph.initializer}
    for product in float_products:  # added to the MatMulNBits of the same input: [K / 32, N] offsets
        (add,) = [n for n in graph.node if n.op_type == "Add" and product.output[0] in n.input]
        kernel = producers[next(i for i in add.input if i != product.output[0])]
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in kernel.attribute}
        reshape = producers[producers[product.input[0]].input[0]]  # ReduceSum(Reshape(x))
        assert kernel.op_type == "MatMulNBits" and kernel.input[0] == reshape.input[0]
        assert shapes[product.input[1]] == [attributes["K"] // 32, attributes["N"]]
    outputs = {o.name for o in graph.output}
    for node in nbits:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        head = node.output[0] in outputs  # the lm_head gives the logits: 8 bits in both recipes
        assert (attributes["bits"], attributes["block_size"], attributes["accuracy_level"]) == (
            8 if head else bits, block, 4
        ), (node.name, attributes)
        assert len(node.input) == 3  # symmetric: no zero points (float ones, HQQ's, leave the fast kernel)
    assert [n for n in nbits if n.output[0] in outputs]
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    table = {i.name: i for i in graph.initializer}.get(
        next(n.input[0] for n in graph.node if n.op_type in ("Gather", "GatherBlockQuantized") and n.input[0]
             in initializers and list({i.name: i for i in graph.initializer}[n.input[0]].dims) == [vocab, hidden])
    )
    assert table.data_type == onnx.TensorProto.INT8  # the embedding
    assert ops.count("GatherBlockQuantized") == 0
    floats = [i.name for i in graph.initializer if i.data_type == onnx.TensorProto.FLOAT and vocab in i.dims
              and hidden in i.dims]
    assert not floats  # no float copy of either left behind
    ratio = weight_bytes(tmp_path) / fp32_weight_bytes(model)
    reloaded = ExportedModel.from_pretrained(tmp_path)
    agreement = top1_agreement(reloaded, sequence, PROMPT_LEN)
    print(f"\n{name}: weight bytes {ratio:.3f}x of fp32, top-1 agreement {agreement:.1%} over {STEPS} steps")
    assert ratio <= max_ratio
    assert agreement >= 0.75


@pytest.mark.parametrize("form", ["Transpose", "FusedMatMul"])
def test_a_transposed_weight_is_materialized_for_the_quantizer(form):
    """A tied lm_head reads the embedding table transposed: MatMul(x, Transpose(W)) (the optimiser leaves a large
    constant unfolded) or, after the ORT fusions, FusedMatMul(x, W, transB=1). It becomes a MatMul with the transposed
    matrix as its own initializer, so MatMulNBitsQuantizer (which takes a plain MatMul with a constant weight)
    quantizes it; the logits keep their name, the table stays for the Gather, the results are the same."""
    import numpy as np
    import onnx_ir as ir
    import onnxruntime as ort

    from hfexport.quantizers.onnx_nbits import _materialize_transposed_weights

    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    embed = ir.Value(name="embed", shape=ir.Shape([4, 3]), type=ir.TensorType(ir.DataType.FLOAT),
                     const_value=ir.tensor(table, name="embed"))
    x = ir.Value(name="x", shape=ir.Shape([1, 3]), type=ir.TensorType(ir.DataType.FLOAT))
    ids = ir.Value(name="ids", shape=ir.Shape([1]), type=ir.TensorType(ir.DataType.INT64))
    if form == "Transpose":
        transpose = ir.node("Transpose", [embed], attributes={"perm": [1, 0]})
        head = [transpose, ir.node("MatMul", [x, transpose.outputs[0]])]
    else:
        head = [ir.node("FusedMatMul", [x, embed], attributes={"transB": 1, "alpha": 1.0}, domain="com.microsoft")]
    gather = ir.node("Gather", [embed, ids])
    head[-1].outputs[0].name = "logits"
    graph = ir.Graph([x, ids], [head[-1].outputs[0], gather.outputs[0]], nodes=[*head, gather],
                     initializers=[embed], opset_imports={"": 21, "com.microsoft": 1})
    model = ir.Model(graph, ir_version=10)
    feeds = {"x": np.array([[1.0, -2.0, 0.5]], dtype=np.float32), "ids": np.array([2])}

    def run():
        session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, feeds)

    before = run()
    assert _materialize_transposed_weights(model) == 1
    assert [n.op_type for n in model.graph] == ["MatMul", "Gather"]
    matmul = next(iter(model.graph))
    weight = matmul.inputs[1]
    assert weight.is_initializer() and np.array_equal(weight.const_value.numpy(), table.T)
    assert gather.inputs[0] is embed and model.graph.outputs[0].name == "logits"
    after = run()
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


# --- the int8 recipes' per-layer choices: float activations and int8 weights for the outlier-carrying layers ------

DOWN = [r"\.mlp\.down_proj$"]


def test_ort_weight_only_modules_keep_float_activations_and_int8_weights(llama, tmp_path):
    """OnnxRuntimeQuantizer(weight_only_modules=...): the down projections stay float MatMuls reading an int8
    per-channel weight through DequantizeLinear; the other projections are ONNX Runtime's dynamic int8
    MatMulInteger; the standard Attention op is left alone (workaround onnxruntime-quantize-standard-attention)."""
    import onnx

    from hfexport import OnnxRuntimeDynamicConfig, OnnxRuntimeQuantizer

    case, model, sequence, _ = llama
    layers = model.config.num_hidden_layers
    config = AutoExportConfig.from_dict({"export_format": "onnx", "dynamic": True})
    config.quantizer = OnnxRuntimeQuantizer(OnnxRuntimeDynamicConfig(per_channel=True), weight_only_modules=DOWN)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        AutoHfExporter.from_config(config).export(model, case.inputs(2, 7), config).save_pretrained(tmp_path)
    graph = onnx.load(str(tmp_path / "model.onnx")).graph
    producers = {out: node for node in graph.node for out in node.output}
    initializers = {i.name: i for i in graph.initializer}
    float_matmuls = [n for n in graph.node if n.op_type == "MatMul" and n.input[1] in producers
                     and producers[n.input[1]].op_type == "DequantizeLinear"]
    assert len(float_matmuls) == layers
    for node in float_matmuls:
        dq = producers[node.input[1]]
        weight = initializers[dq.input[0]]
        assert weight.data_type == onnx.TensorProto.INT8 and len(weight.dims) == 2
        assert initializers[dq.input[1]].dims == [weight.dims[1]]  # one scale per output channel
        assert producers[node.input[0]].op_type != "DequantizeLinear"  # float activations
    assert sum(n.op_type == "MatMulInteger" for n in graph.node) >= 6 * layers
    assert not [n for n in graph.node if n.op_type == "QAttention"]
    reloaded = ExportedModel.from_pretrained(tmp_path)
    assert top1_agreement(reloaded, sequence, PROMPT_LEN) >= 0.75


def test_pt2e_weight_only_annotator_claims_its_layers_before_x86():
    """WeightOnlyInt8Quantizer composed before X86InductorQuantizer: the matched linears and the embedding get an
    int8 per-channel weight and float inputs; every other linear's input is quantized per tensor."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchao.quantization.pt2e.quantizer.composable_quantizer import ComposableQuantizer

    from hfexport.quantizers.fxgraph import module_path
    from hfexport.quantizers.pt2e import x86_int8
    from hfexport.quantizers.pt2e_weights import WeightOnlyInt8Quantizer

    case = TINY_CASES["llama"]
    model = case.build()
    inputs = case.inputs(1, 6, padded=False)
    program = torch.export.export(model, (), dict(inputs), strict=False)
    quantizer = ComposableQuantizer([WeightOnlyInt8Quantizer(DOWN), x86_int8().quantizer])
    prepared = prepare_pt2e(program.module(), quantizer)
    with torch.no_grad():
        prepared(**inputs)
    converted = convert_pt2e(prepared, fold_quantize=False)
    q = torch.ops.quantized_decomposed
    seen = {"down": 0, "other": 0, "embedding": 0}
    for node in converted.graph.nodes:
        if node.target == torch.ops.aten.linear.default:
            activation, weight = node.args[0], node.args[1]
            assert weight.target == q.dequantize_per_channel.default, node
            if module_path(node).endswith("mlp.down_proj"):
                seen["down"] += 1
                assert activation.target != q.dequantize_per_tensor.default, node
            else:
                seen["other"] += 1
                assert activation.target == q.dequantize_per_tensor.default, node
        elif node.target == torch.ops.aten.embedding.default:
            seen["embedding"] += 1
            assert node.args[0].target == q.dequantize_per_channel.default
            assert node.args[0].args[0].args[0].meta["val"].shape == model.get_input_embeddings().weight.shape
    layers = model.config.num_hidden_layers
    assert seen == {"down": layers, "other": 6 * layers + 1, "embedding": 1}


def test_openvino_int8_weight_only_stores_int8_with_per_channel_scales():
    """The OpenVINO weight-only pass: a MatMul's f32 constant weight becomes Constant(i8) -> Convert -> Multiply,
    and the model's output stays within int8 rounding of the float one."""
    import numpy as np
    import openvino as ov
    import openvino.opset13 as ops

    from hfexport.quantizers.nncf import _openvino_int8_weight_only

    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((16, 32)) * np.linspace(0.01, 3, 16)[:, None]).astype(np.float32)
    x = ops.parameter([4, 32], np.float32, name="x")
    matmul = ops.matmul(x, ops.constant(weight), transpose_a=False, transpose_b=True, name="proj")
    model = ov.Model([matmul], [x])
    data = rng.standard_normal((4, 32)).astype(np.float32)
    expected = data @ weight.T
    _openvino_int8_weight_only(model, {"proj"})
    constants = [op for op in model.get_ordered_ops() if op.get_type_name() == "Constant"]
    shapes = {(c.get_element_type().get_type_name(), tuple(c.get_output_shape(0))) for c in constants}
    assert ("i8", (16, 32)) in shapes and ("f32", (16, 32)) not in shapes and ("f32", (16, 1)) in shapes
    got = ov.Core().compile_model(model, "CPU")(data)[0]
    # per output channel: the error scales with that row's largest weight, not the largest overall
    bound = np.abs(data).sum(1, keepdims=True) * (np.abs(weight).max(1) / 254)[None, :]
    assert np.all(np.abs(got - expected) <= bound + 1e-5)
    assert not np.allclose(got, expected, atol=0, rtol=0)


@pytest.mark.parametrize("name,fmt", [("nncf-int8", "openvino")])
def test_static_cache_quantized_export_calibrates_and_generates(name, fmt, llama, tmp_path):
    """The decode-speed artifact of benchmarks/bench_quantized.py: a calibrated recipe on a static cache with
    multi-token decode (one graph serves the prompt and every step, so it calibrates on the prompts too: their
    samples need the decode graph's mask and an allocated cache). Reloaded, it generates the tokens the export did
    before the save, and keeps eager's top-1 as the other int8 pairs do (its greedy text need not be eager's: on an
    AVX2-only AMD EPYC, whose int8 kernels round otherwise, it departed at the 14th of 16 new tokens)."""
    import copy

    case, model, sequence, calibration = llama
    generation = copy.deepcopy(model.generation_config)
    generation.cache_implementation, generation.max_cache_len, generation.do_sample = "static", 80, False
    config = AutoExportConfig.from_dict({"export_format": fmt, "dynamic": True})
    config.quantizer = recipe(name, fmt, calibration)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exported = AutoHfExporter.from_config(config).export_for_generation(
            model, case.inputs(1, 6, padded=False), config, generation_config=generation, multi_token_decode=True
        )
    exported.save_pretrained(tmp_path)
    reloaded = ExportedModel.from_pretrained(tmp_path)
    prompt = sequence[:, :PROMPT_LEN]
    got = reloaded.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                            do_sample=False)
    before = exported.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=16,
                               do_sample=False)
    assert torch.equal(got, before)
    assert top1_agreement(reloaded, sequence, PROMPT_LEN) >= PAIRS[(name, fmt)][1]


def test_weight_only_config_hqq_and_int8_modules_change_the_quantized_graph():
    """OnnxRuntimeWeightOnlyConfig on a two-MatMul graph: algorithm="HQQ" stores float zero points (round to nearest,
    symmetric, none) and the configured accuracy_level, and reproduces the float result at least as closely as
    rounding; int8_modules puts the matched MatMul (by its module path) at 8 bits, the other stays at 4."""
    import numpy as np
    import onnx_ir as ir
    import onnxruntime as ort

    from hfexport import OnnxRuntimeWeightOnlyConfig
    from hfexport.quantizers.onnx_nbits import quantize_nbits

    rng = np.random.default_rng(0)

    def build():
        x = ir.Value(name="x", shape=ir.Shape([4, 64]), type=ir.TensorType(ir.DataType.FLOAT))
        weights, nodes, value = [], [], x
        for i, path in enumerate(["model.layers.0.mlp.up_proj", "lm_head"]):
            data = rng.standard_normal((64, 64)).astype(np.float32) if len(built) == 0 else built[0][i]
            w = ir.Value(name=f"w{i}", shape=ir.Shape([64, 64]), type=ir.TensorType(ir.DataType.FLOAT),
                         const_value=ir.tensor(data, name=f"w{i}"))
            node = ir.node("MatMul", [value, w], name=f"matmul{i}",
                           metadata_props={"pkg.torch.onnx.name_scopes": repr(["", path, f"matmul{i}"])})
            weights.append(w), nodes.append(node)
            value = node.outputs[0]
        value.name = "y"
        built.append([w.const_value.numpy() for w in weights])
        graph = ir.Graph([x], [value], nodes=nodes, initializers=weights, opset_imports={"": 21})
        return ir.Model(graph, ir_version=10)

    built: list = []
    feeds = {"x": rng.standard_normal((4, 64)).astype(np.float32)}

    def run(model):
        session = ort.InferenceSession(ir.to_proto(model).SerializeToString(), providers=["CPUExecutionProvider"])
        return session.run(None, feeds)[0]

    reference = run(build())
    results = {}
    for name, config in {
        "rtn": OnnxRuntimeWeightOnlyConfig(bits=4),
        "hqq": OnnxRuntimeWeightOnlyConfig(bits=4, algorithm="HQQ"),
        "mixed": OnnxRuntimeWeightOnlyConfig(bits=4, int8_modules=(r"(^|\.)lm_head$",)),
    }.items():
        quantized = quantize_nbits(build(), config)
        nodes = {n.name: n for n in quantized.graph if n.op_type == "MatMulNBits"}
        assert len(nodes) == 2, name
        bits = [nodes[k].attributes["bits"].value for k in sorted(nodes)]
        assert all(n.attributes["accuracy_level"].value == 4 for n in nodes.values())
        zero_points = [n.inputs[3] for n in nodes.values() if len(n.inputs) > 3 and n.inputs[3] is not None]
        if name == "hqq":
            assert len(zero_points) == 2 and all(z.const_value.dtype == ir.DataType.FLOAT for z in zero_points)
        else:
            assert not zero_points
        assert bits == ([4, 8] if name == "mixed" else [4, 4]), (name, sorted(nodes), bits)
        results[name] = float(np.abs(run(quantized) - reference).max())
    assert 0 < results["mixed"] < results["rtn"]  # the 8-bit layer's error is smaller
    assert 0 < results["hqq"] < results["rtn"], results
