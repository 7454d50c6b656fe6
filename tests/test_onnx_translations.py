"""torchlib translations that convert but compute something else (or that ONNX Runtime refuses), each replaced by a
registered workaround, and transformers' traced tensor checks dropped before the conversion. Each case is a model
piece that image-text models trace (issue 22: DeepSeek-VL and Aya Vision logits off by 0.7-0.9 in ONNX; Idefics2/3
and SmolVLM refused by ONNX Runtime or by the converter)."""

from __future__ import annotations

import pytest
import torch

from hfexport import OnnxConfig, OnnxExporter
from hfexport.errors import ExportError


class _Merge(torch.nn.Module):
    """The image-feature merge of a VLM whose placeholder mask is ``[B, S, 1]`` (not expanded over the hidden size)."""

    def forward(self, embeds: torch.Tensor, ids: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        return embeds.masked_scatter((ids == 7).unsqueeze(-1), features)


class _Positions(torch.nn.Module):
    """Idefics2's patch positions: a ``torch.full(..., fill_value=0)`` (int64) beside int64 ids."""

    def forward(self, mask: torch.Tensor) -> torch.Tensor:
        ids = torch.arange(mask.shape[-1]).expand_as(mask)
        return torch.where(mask, ids, torch.full(mask.shape, fill_value=0))


class _Checked(torch.nn.Module):
    """``torch_compilable_check`` as transformers traces it: ``_check_tensor_all`` (``aten._is_all_true``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._check_tensor_all(x.sum(-1) > -1e9)
        return x * 2


class _Scaled(torch.nn.Module):
    """An integer tensor cast and scaled by numbers: torch.onnx's type promotion rebuilds it as ``mul.Scalar``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(torch.float32) * 1.0 + x.to(torch.int64).mul(2.5)


class _Joint(torch.nn.Module):
    """A transducer's joint network as Parakeet's: ``[B, T, 1, H] + [B, 1, U, H]``, then ``squeeze(2)``, which torch
    leaves alone when U is not 1; and a squeeze of a real size-1 dimension beside it."""

    def forward(self, frames: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        joint = (frames.unsqueeze(2) + tokens.unsqueeze(1)).relu()
        return joint.squeeze(2), frames.unsqueeze(2).squeeze(2)


class _OneMinus(torch.nn.Module):
    """``1.0 - mask`` over an integer mask (TimesFM's ``1.0 - patched_pads``): ``rsub`` decomposes to
    ``sub(1.0, mask)``, whose cast the type promotion pass must insert."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x * (1.0 - mask) + (2 - mask.to(torch.float64)).to(torch.float32)


class _TinyEps(torch.nn.Module):
    """MuseSpark's RMSNorm with ``eps=1e-8`` over rows that are all zero (left padding), and a scale of 1.000001."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.pow(x.pow(2).mean(-1, keepdim=True) + 1e-8, -0.5) * 1.000001


def _export(module, inputs):
    exported = OnnxExporter().export(module, inputs, OnnxConfig(dynamic=True))
    return exported, exported.components["model"].metadata.workarounds


def test_masked_scatter_with_a_mask_that_broadcasts_over_the_hidden_size():
    ids = torch.tensor([[0, 0, 7, 7, 3, 4], [7, 7, 5, 6, 2, 1]])
    embeds, features = torch.randn(2, 6, 8), torch.randn(4, 8)
    exported, fired = _export(_Merge(), {"embeds": embeds, "ids": ids, "features": features})
    assert "onnx-masked-scatter-broadcast" in fired
    expected = _Merge()(embeds, ids, features)
    assert torch.equal(expected[0, 2], features[0])  # (whole rows are replaced: what the workaround keeps)
    assert (exported(embeds=embeds, ids=ids, features=features) - expected).abs().max() == 0


def test_a_fill_without_a_dtype_keeps_torchs_integer_dtype():
    mask = torch.tensor([[True, True, False], [True, False, False]])
    exported, fired = _export(_Positions(), {"mask": mask})  # ONNX Runtime refused to load it before
    assert "onnx-full-dtype" in fired
    got = exported(mask=mask)
    assert got.dtype == torch.int64 and torch.equal(got, _Positions()(mask))


def test_a_traced_tensor_check_is_dropped_before_the_conversion():
    x = torch.randn(2, 3)
    exported, _ = _export(_Checked(), {"x": x})  # "No ONNX function found for aten._is_all_true" before
    assert torch.equal(exported(x=x), x * 2)


def test_a_scalar_multiplication_converts():
    from hfexport.workarounds import registry

    x = torch.randint(0, 5, (2, 3), dtype=torch.int32)
    mul_scalar = next(w for w in registry.workarounds("onnx") if w.id == "onnx-mul-scalar")
    applies = mul_scalar.applies
    object.__setattr__(mul_scalar, "applies", lambda model, inputs: False)
    try:  # without the workaround: "No ONNX function found for <OpOverload(op='aten.mul', overload='Scalar')>"
        with pytest.raises(ExportError, match="lower"):
            _export(_Scaled(), {"x": x})
    finally:
        object.__setattr__(mul_scalar, "applies", applies)
    exported, fired = _export(_Scaled(), {"x": x})
    assert "onnx-mul-scalar" in fired
    assert torch.equal(exported(x=x), _Scaled()(x))


def test_a_squeeze_of_a_dimension_that_is_not_one_stays_a_no_op_as_in_torch():
    from hfexport.workarounds import registry

    inputs = {"frames": torch.randn(2, 4, 8), "tokens": torch.randn(2, 3, 8)}
    expected = _Joint()(**inputs)
    assert expected[0].shape == (2, 4, 3, 8) and expected[1].shape == (2, 4, 8)
    squeeze = next(w for w in registry.workarounds("onnx") if w.id == "onnx-squeeze-noop")
    applies = squeeze.applies
    object.__setattr__(squeeze, "applies", lambda model, inputs: False)
    try:  # without it ONNX Runtime refuses the graph: "Dimension of input 2 must be 1 instead of 3"
        with pytest.raises(Exception, match="must be 1 instead of 3"):
            OnnxExporter().export(_Joint(), inputs, OnnxConfig(dynamic=False))(**inputs)
    finally:
        object.__setattr__(squeeze, "applies", applies)
    exported = OnnxExporter().export(_Joint(), inputs, OnnxConfig(dynamic=False))
    assert "onnx-squeeze-noop" in exported.components["model"].metadata.workarounds
    got = exported(**inputs)
    assert [tuple(t.shape) for t in got] == [(2, 4, 3, 8), (2, 4, 8)]
    assert all(torch.equal(g, e) for g, e in zip(got, expected))


def test_a_number_minus_a_tensor_converts_where_its_operand_is_cast():
    from hfexport.workarounds import registry

    inputs = {"x": torch.randn(2, 5), "mask": torch.tensor([[0, 1, 1, 0, 1], [1, 1, 0, 0, 0]])}
    first = next(w for w in registry.workarounds("onnx") if w.id == "onnx-scalar-first-operand")
    applies = first.applies
    object.__setattr__(first, "applies", lambda model, inputs: False)
    try:  # "Cannot find a compatible OpOverload for aten.sub with the provided arguments"
        with pytest.raises(ExportError, match="lower"):
            _export(_OneMinus(), inputs)
    finally:
        object.__setattr__(first, "applies", applies)
    exported, fired = _export(_OneMinus(), inputs)
    assert "onnx-scalar-first-operand" in fired
    assert torch.equal(exported(**inputs), _OneMinus()(**inputs))


def test_the_optimizer_keeps_an_eps_of_1e_8_and_a_scale_of_1_000001():
    from hfexport.workarounds import registry

    x = torch.randn(2, 4, 8)
    x[0, :2] = 0.0
    expected = _TinyEps()(x)
    assert not expected.isnan().any() and expected[0, 0].eq(0).all()
    tolerance = next(w for w in registry.workarounds("onnx") if w.id == "onnx-no-op-tolerance")
    applies = tolerance.applies
    object.__setattr__(tolerance, "applies", lambda model, inputs: False)
    try:  # onnxscript's no-op rules take 1e-8 for 0: x * (0)^-0.5 = 0 * inf
        assert OnnxExporter().export(_TinyEps(), {"x": x}, OnnxConfig(dynamic=True))(x=x).isnan().any()
    finally:
        object.__setattr__(tolerance, "applies", applies)
    exported = OnnxExporter().export(_TinyEps(), {"x": x}, OnnxConfig(dynamic=True))
    assert (exported(x=x) - expected).abs().max() < 1e-6


def test_a_complex_rotary_embedding_converts():
    """DeepSeek-V2's rotary embedding (torch.polar, a complex multiply): torchlib has no complex ``unsqueeze``
    ("No ONNX function found for aten.unsqueeze.default"); workaround onnx-complex-rotary traces it with real
    arithmetic (the same one OpenVINO's and ExecuTorch's use)."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model
    from hfexport.validation import compare_outputs

    model = build_model("deepseek_v2", "DeepseekV2ForCausalLM")
    inputs = sample_inputs(model, "deepseek_v2")
    with torch.no_grad():
        eager = model(**inputs)
    exported, fired = _export(model, inputs)
    assert "onnx-complex-rotary" in fired
    report = compare_outputs(exported(**inputs), eager)
    assert not report["problems"] and report["max_abs_diff"] <= 1e-4, report


def test_gemma3n_activation_sparsity_converts_with_its_quantile_computed_before_the_trace():
    """'No ONNX function found for prims.erf_inv' (Normal(0, 1).icdf of a constant in Gemma3nTextMLP) without
    workaround onnx-gemma3n-constant-quantile."""
    from hfexport.tools.matrix.inputs import sample_inputs
    from hfexport.tools.matrix.shrink import build_model

    model = build_model("gemma3n_text", "Gemma3nForCausalLM")
    assert any(getattr(m, "activation_sparsity", 0.0) > 0 for m in model.modules())
    inputs = sample_inputs(model, "gemma3n_text")
    exported = OnnxExporter().export(model, inputs, OnnxConfig(dynamic=False))
    assert "onnx-gemma3n-constant-quantile" in exported.components["model"].metadata.workarounds
    with torch.no_grad():
        expected = model(**inputs).logits
    assert (exported(**inputs).logits - expected).abs().max() <= 1e-4


class _Deepstack(torch.nn.Module):
    """A deepstack layer's update (Granite Docling, Qwen3-VL): one row per masked position, added in place; then a
    fill of every masked position with one value (torchlib's own conversion, which broadcasts)."""

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = hidden.clone()
        hidden[mask, :] = hidden[mask, :] + rows
        filled = hidden.clone()
        filled[mask] = 0.5
        return hidden, filled


def test_a_boolean_index_put_of_one_row_per_masked_position_writes_those_rows():
    # five masked positions in rows of five: torchlib's Where(mask, rows, x) broadcast [5, 8] over [2, 5, 8] and
    # mixed the rows (off by 6.7) without an error
    hidden, rows = torch.randn(2, 5, 8), torch.randn(5, 8)
    mask = torch.tensor([[1, 0, 1, 0, 0], [0, 1, 1, 1, 0]], dtype=torch.bool)
    exported, fired = _export(_Deepstack(), {"hidden": hidden, "mask": mask, "rows": rows})
    assert "onnx-index-put-mask-rows" in fired
    for got, want in zip(exported(hidden=hidden, mask=mask, rows=rows), _Deepstack()(hidden, mask, rows)):
        assert (got - want).abs().max() == 0
    three = torch.tensor([[1, 0, 0, 0, 0], [0, 1, 1, 0, 0]], dtype=torch.bool)  # another count, the same graph
    for got, want in zip(exported(hidden=hidden, mask=three, rows=rows[:3]), _Deepstack()(hidden, three, rows[:3])):
        assert (got - want).abs().max() == 0


class _PaddingMaskAttention(torch.nn.Module):
    """SDPA with a BERT-era extended padding mask ``[batch, 1, 1, keys]`` that torch broadcasts over the queries."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        extended = (1.0 - mask[:, None, None, :].to(q.dtype)) * torch.finfo(q.dtype).min
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=extended)


def test_an_attention_mask_that_broadcasts_over_the_queries_runs_in_onnx_runtime(without_workaround):
    """ONNX Runtime's Attention requires the mask's query axis to be the query length ("inconsistent
    q_sequence_length (between attn_mask and Q)", LayoutLM): the program's mask is expanded first
    (workaround onnx-attention-mask-rows)."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=gen) for _ in range(3))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, :2] = 0
    inputs = {"q": q, "k": k, "v": v, "mask": mask}
    exported, fired = _export(_PaddingMaskAttention(), inputs)
    assert "onnx-attention-mask-rows" in fired
    expected = _PaddingMaskAttention()(q, k, v, mask)
    assert (expected - _PaddingMaskAttention()(q, k, v, torch.ones_like(mask))).abs().max() > 1e-2  # the mask matters
    got = exported(**inputs)
    assert (got[0] if isinstance(got, (tuple, list)) else got).sub(expected).abs().max() <= 1e-5

    without_workaround("onnx-attention-mask-rows")
    with pytest.raises(Exception, match="q_sequence_length"):  # the premise: ONNX Runtime refuses the mask as it is
        _export(_PaddingMaskAttention(), inputs)[0](**inputs)


class _MinMaskAttention(torch.nn.Module):
    """An SDPA whose additive float mask fills masked keys with ``finfo.min`` (Doge's dynamic mask): a left-padded
    query row is ``min`` on every key, another ``-inf`` on every key."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        low = torch.finfo(q.dtype).min
        mask = torch.triu(torch.full((q.shape[-2], k.shape[-2]), low), 1) + bias
        mask = mask.expand(q.shape[0], 1, -1, -1).clone()
        mask[0, :, 0] = low  # a padded row: every key masked with min
        mask[1, :, 0] = float("-inf")  # every key masked with -inf
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_an_attention_row_masked_with_the_float_minimum_averages_as_in_torch(without_workaround):
    """A query row whose every key holds finfo(float32).min: torch's softmax weighs the keys equally, ONNX Runtime's
    Attention kernel gives zeros; the program's min entries move one float step up (workaround
    onnx-attention-min-mask), and a row of -inf stays zeros in both."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 5, 8, generator=gen) for _ in range(3))
    bias = torch.rand(5, 5, generator=gen)
    inputs = {"q": q, "k": k, "v": v, "bias": bias}
    expected = _MinMaskAttention()(q, k, v, bias)
    assert torch.allclose(expected[0, :, 0], v[0].mean(-2), atol=1e-6)  # the premise: torch averages the min row
    assert expected[1, :, 0].abs().max() == 0  # and gives zeros for the -inf row
    exported, fired = _export(_MinMaskAttention(), inputs)
    assert "onnx-attention-min-mask" in fired
    got = exported(**inputs)
    assert (got[0] if isinstance(got, (tuple, list)) else got).sub(expected).abs().max() <= 1e-5

    without_workaround("onnx-attention-min-mask")
    plain = _export(_MinMaskAttention(), inputs)[0](**inputs)
    plain = plain[0] if isinstance(plain, (tuple, list)) else plain
    assert plain[0, :, 0].abs().max() == 0  # the upstream behaviour: ONNX Runtime zeroes the min row
    assert plain[0, :, 1:].sub(expected[0, :, 1:]).abs().max() <= 1e-5


class _NgramHash(torch.nn.Module):
    """BLT's n-gram hash: ``sum(tokens * prime ** i)`` in int64, wrapping past its range, then ``% vocab``; beside
    it a sum over every axis, one over an empty axis and one of values past 2**53 that does not wrap."""

    def forward(self, tokens: torch.Tensor, empty: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # (a group size the config fixes: the powers fold to constants; ONNX Runtime's Pow of int64 itself goes
        # through double too, not rewritten here)
        powers = torch.tensor(1000000007, dtype=torch.int64) ** torch.arange(8)
        hashed = torch.sum(tokens * powers, dim=-1)
        exact = (tokens + 2**53).sum(dim=(0, 2), keepdim=True)
        return hashed % 30000, hashed, (tokens * powers).sum(), empty.sum(-1), exact


def test_an_int64_sum_adds_exactly_and_wraps_as_in_torch(without_workaround):
    """ONNX Runtime's ReduceSum adds int64 in floating point (BLT's n-gram hash ids all differed): each 64-bit
    integer sum is a CumSum whose last element is kept (workaround onnx-integer-sum)."""
    gen = torch.Generator().manual_seed(0)
    inputs = {"tokens": torch.randint(0, 256, (2, 5, 8), generator=gen), "empty": torch.zeros(3, 0, dtype=torch.long)}
    expected = _NgramHash()(**inputs)
    exported, fired = _export(_NgramHash(), inputs)
    assert "onnx-integer-sum" in fired
    for got, want in zip(exported(**inputs), expected, strict=True):
        assert got.dtype == want.dtype and torch.equal(got, want)

    without_workaround("onnx-integer-sum")
    plain = _export(_NgramHash(), inputs)[0](**inputs)
    assert not torch.equal(plain[0], expected[0])  # the premise: the hash ids differ
    assert not torch.equal(plain[4], expected[4])  # and a sum past 2**53 loses its low bits


class _WithSizes(torch.nn.Module):
    """A backbone that returns its feature map's spatial sizes beside it (MaskFormer's Swin: ints)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int], torch.Tensor]:
        pooled = torch.nn.functional.avg_pool2d(x, 2)
        return pooled, (pooled.shape[-2], pooled.shape[-1]), pooled.sum(-1)


def test_sizes_returned_beside_the_tensors_come_back_from_the_runner(without_workaround):
    """torch.onnx stops at an int output ("'int' object has no attribute 'name'"); the graph leaves the constants
    out (workaround onnx-constant-outputs) and the runner returns them in their places, as eager does."""
    x = torch.randn(2, 3, 8, 8)
    expected = _WithSizes()(x)
    exported = OnnxExporter().export(_WithSizes(), {"x": x}, OnnxConfig())  # (static: the sizes are constants)
    assert "onnx-constant-outputs" in exported.components["model"].metadata.workarounds
    got = exported(x=x)
    assert tuple(got[1]) == expected[1] == (4, 4)
    assert torch.allclose(got[0], expected[0], atol=1e-6) and torch.allclose(got[2], expected[2], atol=1e-5)

    without_workaround("onnx-constant-outputs")
    with pytest.raises(ExportError, match="has no attribute 'name'"):  # the premise
        OnnxExporter().export(_WithSizes(), {"x": x}, OnnxConfig())


def test_an_element_count_read_as_a_size_converts(monkeypatch):
    """Muse Spark's vision tower, as the matrix runs it (eager first, then the export, compared): a tensor's
    ``numel()`` read as a size reaches the conversion as ``aten.sym_numel``, which torchlib has no function for."""
    from hfexport.backends.onnx import convert
    from hfexport.tools.matrix.worker import run_case

    case = ("muse_spark_vision", "MuseSparkVisionModel", "feature-extraction", "onnx", "export")
    table = convert.translation_table
    with monkeypatch.context() as patched:  # the premise
        patched.setattr(convert, "translation_table", lambda opset: {
            k: v for k, v in table(opset).items() if k is not torch.ops.aten.sym_numel.default})
        row = run_case(*case)
        assert row["status"] == "fail" and "sym_numel" in row["reason"], row
    row = run_case(*case)
    assert row["status"] == "pass" and row["max_abs_diff"] <= 1e-4, row


class _Pooled(torch.nn.Module):
    """Molmo 2's image pooling: patch features gathered by a 2-D int32 index table (its processor's
    ``image_token_pooling``), and a row written back through an int32 index."""

    def forward(self, features: torch.Tensor, pooling: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        gathered = features[pooling.clip(0)]
        written = features.clone()
        written[rows] = gathered[: rows.shape[0], 0]
        return gathered.mean(-2), written


def test_an_int32_index_table_gathers_as_in_torch(without_workaround):
    """GatherND and ScatterND take int64 indices only; torchlib hands them an int32 index as it is, which ONNX
    Runtime refuses at load (workaround onnx-index-dtype casts it)."""
    gen = torch.Generator().manual_seed(0)
    inputs = {"features": torch.randn(12, 8, generator=gen),
              "pooling": torch.randint(-1, 12, (5, 4), generator=gen, dtype=torch.int32),
              "rows": torch.tensor([3, 0, 7], dtype=torch.int32)}
    expected = _Pooled()(**inputs)
    exported, fired = _export(_Pooled(), inputs)
    assert "onnx-index-dtype" in fired
    for got, want in zip(exported(**inputs), expected, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)

    without_workaround("onnx-index-dtype")
    with pytest.raises(Exception, match="tensor\\(int32\\).*(GatherND|ScatterND)"):
        _export(_Pooled(), inputs)[0](**inputs)
