"""Named quantization recipes (the CLI's ``--quantize``) and calibration prompts from a JSONL file.

Each recipe picks, for an export format, the quantizer and settings that serve it:

=============  ========================================================================================
``pt2e-int8``  PT2E int8 on the FX graph: ``X86InductorQuantizer`` on the linears (Dynamo, ONNX, OpenVINO; q, k, v,
               MLP and lm_head int8 weight-only), ``XNNPACKQuantizer`` with dynamic int8 activations
               (ExecuTorch); embeddings get int8 weight-only (torchao's ``EmbeddingQuantizer``)
``ort-dynamic`` ONNX Runtime ``quantize_dynamic``, per-channel weights (ONNX only); the RMSNorm-fed layers (q, k, v,
               MLP, lm_head) int8 weight-only
``ort-static``  ONNX Runtime ``quantize_static``, QDQ, per-channel weights (ONNX only); the RMSNorm-fed layers
               (q, k, v, MLP, lm_head) int8 weight-only
``ort-int8``   ONNX Runtime ``MatMulNBits`` (``MatMulNBitsQuantizer``): int8 weights in blocks of 16, symmetric,
               ``accuracy_level=4`` (int8 activations inside the kernel); every MatMul, the tied lm_head included,
               and the embedding (int8 per row, only the looked-up rows dequantized). No calibration (ONNX only)
``ort-int4``   4 bits in blocks of 32, HQQ codes with float zero points (ONNX Runtime's data-free HQQ solver), run as
               the fast symmetric ``MatMulNBits`` plus each block's float offset as a small product of the input's
               block sums (``split_zero_points``); the lm_head 8 bits (NNCF's backup precision for the last layer),
               the embedding int8 per row
``nncf-int8``  NNCF ``quantize`` (int8 weights and activations, SmoothQuant alpha 0.5) on the converted ONNX /
               OpenVINO model; on the FX graph (Dynamo, ExecuTorch) NNCF int8 weight-only compression
``nncf-int8-weights``  NNCF int8 weight-only compression (one scale per output channel, data-free) on the
               converted ONNX / OpenVINO model or the FX graph; OpenVINO's CPU plugin quantizes the activations of
               these layers to int8 at run time (its dynamic quantization, groups of 32)
``nncf-int4``  NNCF int4 weight compression (group size 32; int8 for the embeddings and the last layer, NNCF's
               default backup), on the converted ONNX / OpenVINO model or the FX graph (Dynamo; not ExecuTorch,
               whose to_edge refuses the op NNCF unpacks 4-bit weights with); given calibration prompts, on
               OpenVINO, with AWQ and scale estimation
``hqq-int4``   HQQ int4 weights in groups of 32 with float zero points (ONNX Runtime's data-free HQQ solver),
               written as OpenVINO's compressed-weight pattern, which its CPU plugin runs as fast as integer zero
               points; the lm_head and the embedding NNCF int8 per channel, symmetric (OpenVINO only: ONNX
               Runtime's MatMulNBits leaves its fast kernels for float zero points). Data-free
``int8-groups``  int8 weights, symmetric, one scale per group of 32 inputs, written as OpenVINO's compressed-weight
               pattern (NNCF's int8 modes keep one scale per output channel); the lm_head and the embedding NNCF
               int8 per channel (OpenVINO only). Data-free
``torchao-8da4w``  torchao ``quantize_`` on the eager model before the trace, as ExecuTorch's LLM export does
               (ExecuTorch only): int8 dynamic per-token activations x int4 weights in groups of 32, HQQ codes and
               scales (``Int8DynamicActivationIntxWeightConfig``), which XNNPACK runs as its qd8-f32-qb4w
               fully-connected, and HQQ's float zero points as each group's offset, a small float product of the
               input's group sums (``float_zero_points``: the kernel takes symmetric weights only); the lm_head and the MLP down projections 8da8w (int8 per channel, qd8-f32-qc8w), the embedding int8
               per row (ExecuTorch's ``quantized_decomposed::embedding_byte``). Data-free
=============  ========================================================================================
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..configs import ExportFormat, parse_format
from .base import ExportQuantizer

__all__ = ["RECIPES", "recipe", "read_prompts", "prompt_samples", "cli_quantizer"]

RECIPES = (
    "pt2e-int8", "ort-dynamic", "ort-static", "ort-int8", "ort-int4", "nncf-int8", "nncf-int8-weights", "nncf-int4",
    "hqq-int4", "int8-groups", "torchao-8da4w",
)

# The int8 recipes keep these layers' activations in float and store their weights as int8 (one scale per output
# channel): MLP projections of Llama-family models (Llama, Mistral, Qwen2, Gemma, SmolLM2), whose inputs carry the
# large activation outliers one per-tensor int8 scale loses. Patterns over module paths (re.search). Measured on
# SmolLM2-135M (top-1 agreement with eager, one graph over 82 tokens): ONNX Runtime dynamic 61 % -> 88 % with the
# down projections float, 94 % with the whole MLP; NNCF on OpenVINO (SmoothQuant, 12 realistic calibration prompts)
# 84 % -> 95 % with the down projections, 88 % with the whole MLP.
MLP_MODULES = (r"(^|\.)mlp\.(gate_proj|up_proj|down_proj)$",)
LM_HEAD_MODULES = (r"(^|\.)lm_head$",)
DOWN_PROJ_MODULES = (r"(^|\.)mlp\.down_proj$",)
EMBEDDING_MODULES = (r"(^|\.)embed_tokens$",)  # NNCF's ONNX backend leaves a Gather's table float; int8 per row
# Static (calibrated) per-tensor activations also lose the outliers of the other RMSNorm-fed projections (q, k, v,
# and the tied lm_head after the final norm); SmolLM2, ORT static, 4 evaluation prompts: MLP float 85.5 %, + lm_head
# 88.3 %, + q, k, v 91.4 % (o_proj, fed by the attention output, keeps static int8 activations). ORT dynamic (one
# scale per call) too: MLP float 88.7 %, + lm_head 88.7 %, + q, k, v 91.0 %
NORM_FED_MODULES = MLP_MODULES + (r"(^|\.)self_attn\.(q_proj|k_proj|v_proj)$",) + LM_HEAD_MODULES
# SmoothQuant's migration strength for nncf-int8: the SmoothQuant paper's 0.5 instead of NNCF's TRANSFORMER default
# 0.95, which moves nearly all of an outlier channel's range into the weights. SmolLM2 on OpenVINO, 4 evaluation
# prompts: 89.1 % -> 91.8 % top-1 agreement, same size (benchmarks/RESULTS_QUANTIZED.md)
SMOOTH_QUANT_ALPHA = 0.5
# torchao-8da4w: how the int4 weights' scales are chosen ("affine": round to nearest over each group's range;
# "hqq_scale_only": HQQ's scale fit, what ExecuTorch's LLM export uses), the lm_head ("int4", "int8": 8da8w per
# channel, "float"), the MLP down projections (int8 per channel where TORCHAO_INT8_DOWN: their inputs carry the
# activation outliers) and the embedding ("int8" per row, "int4" groups of 32, None: float). SmolLM2, top-1 of the
# eager quantized model over one forward (4 evaluation / 4 held-out prompts, 64 steps): affine 68.0 / 68.0 %, + lm_head
# int8 72.3 / 71.9 %; HQQ 69.9 / 69.5 %, + lm_head int8 73.4 / 73.0 % (float lm_head: 74.6 / 73.4 %), + down_proj int8
# 82.4 / 76.2 %; int4 weight-only (float activations) 73.1 / 75.0 %: the 4-bit weights, not the int8 activations,
# lose the tokens. The ExecuTorch export of this recipe: 0.240x, 80.5 / 75.8 % through its decode loop, decode 3.06x the
# fp32 ExecuTorch export's. With HQQ's float zero points split off (TORCHAO_FLOAT_ZERO_POINTS, torchao_offsets.py): eager
# 93.4 / 92.2 % (int4 down projections: 92.6 / 92.2 %); the export 0.26x, 92.2 / 93.8 % through its decode loop, decode
# 3.06x its fp32 export's (benchmarks/RESULTS_QUANTIZED.md)
TORCHAO_QPARAMS = "hqq_scale_only"
TORCHAO_LM_HEAD = "int8"
TORCHAO_INT8_DOWN = True
TORCHAO_EMBEDDING = "int8"
TORCHAO_FLOAT_ZERO_POINTS = True


def recipe(name: str, export_format: ExportFormat | str, calibration: Iterable[dict] | None = None) -> ExportQuantizer:
    """The quantizer recipe ``name`` builds for ``export_format``.

    Raises:
        ValueError: An unknown recipe, or one that cannot serve ``export_format``.

    Example:
        >>> recipe("ort-dynamic", "onnx")
        OnnxRuntimeQuantizer(OnnxRuntimeDynamicConfig(...))
    """
    fmt = parse_format(export_format)
    if name not in RECIPES:
        raise ValueError(f"unknown quantization recipe {name!r}; choose one of {', '.join(RECIPES)}")
    if name == "pt2e-int8":
        quantizer = _pt2e(fmt, calibration)
    elif name in ("ort-dynamic", "ort-static"):
        from .onnxruntime import OnnxRuntimeDynamicConfig, OnnxRuntimeQuantizer, OnnxRuntimeStaticConfig

        # per-channel weights: ONNX Runtime's per-tensor default loses half of SmolLM2's greedy tokens
        if name == "ort-dynamic":
            quantizer = OnnxRuntimeQuantizer(
                OnnxRuntimeDynamicConfig(per_channel=True), weight_only_modules=NORM_FED_MODULES
            )
        else:
            quantizer = OnnxRuntimeQuantizer(
                _ort_static_config(), calibration_dataset=calibration, weight_only_modules=NORM_FED_MODULES
            )
    elif name in ("ort-int8", "ort-int4"):
        from .onnxruntime import OnnxRuntimeQuantizer, OnnxRuntimeWeightOnlyConfig

        # data-free weight-only: the calibration prompts, if any, are not needed. int4: SmolLM2, top-1 agreement on
        # one graph over the 4 evaluation / 4 held-out prompts: round-to-nearest symmetric 74 / 69 %, + lm_head int8
        # 75 / 73 %, asymmetric + lm_head int8 75 / 78 %; HQQ + lm_head int8 98 / 99 %, but HQQ's float zero points
        # take MatMulNBits off its fast path (125 ms against 14 ms a token; 7.7 decode tok/s, 0.64x eager), and
        # rounding them to int4 gives back the round-to-nearest figures (75 / 76 %). Split off as block offsets
        # (onnx_offsets.py), through the fused decode loop: 97.7 / 94.9 % at 2.37x the fused fp32 export's decode
        # (round to nearest: 76.2 / 73.8 % at 2.81x), 0.261x of the fp32 weights. benchmarks/RESULTS_QUANTIZED.md
        if name == "ort-int8":
            # blocks of 16: SmolLM2 through the fused decode loop, top-1 on the evaluation prompts (on which this
            # was chosen) 97.7 % against 97.3 % for blocks of 32 and 95.7 % asymmetric (held-out: 96.9 / 94.5 /
            # 96.1 %); decode 2.01x the fused fp32 export against 2.39x, 0.366x of the fp32 weights against 0.335x
            config = OnnxRuntimeWeightOnlyConfig(bits=8, block_size=16)
        else:
            config = OnnxRuntimeWeightOnlyConfig(bits=4, algorithm="HQQ", split_zero_points=True,
                                                 int8_modules=LM_HEAD_MODULES)
        quantizer = OnnxRuntimeQuantizer(config)
    elif name == "torchao-8da4w":
        quantizer = _torchao_8da4w()
    elif name in ("hqq-int4", "int8-groups"):
        from .openvino_groups import GroupWeightConfig, GroupWeightOpenVINOQuantizer

        # SmolLM2 (benchmarks/RESULTS_QUANTIZED.md), top-1 eval / held-out through the decode loop: hqq-int4 98.0 /
        # 97.7 % at 0.176x; int8-groups 96.9 / 96.1 % at 0.263x (its lm_head in groups too: 98.0 / 96.1 %, 0.32x,
        # and a head 1.7x slower) against NNCF's per-channel int8 94.1 / 97.3 % (INT8_ASYM: 94.5 / 95.7 %)
        bits, zero_points = (4, "hqq") if name == "hqq-int4" else (8, "none")
        config = GroupWeightConfig(bits=bits, zero_points=zero_points, group_size=32, backup_modules=LM_HEAD_MODULES)
        quantizer = GroupWeightOpenVINOQuantizer(config)
    else:
        quantizer = _nncf(name, fmt, calibration)
    quantizer.validate_environment(fmt)  # an unsupported pair says so now, before the model loads
    return quantizer


def _pt2e(fmt: Any, calibration: Iterable[dict] | None) -> ExportQuantizer:
    from torchao.quantization.pt2e.quantizer.composable_quantizer import ComposableQuantizer

    from .pt2e import PT2EQuantizer, xnnpack_int8
    from .pt2e_weights import WeightOnlyInt8Quantizer

    if fmt == ExportFormat.EXECUTORCH:
        # dynamic int8 activations (one scale per call): static calibrated per-tensor scales lose the RMSNorm-fed
        # layers' outlier channels; SmolLM2, static cache + multi-token decode, 4 evaluation prompts: static 52.0 %
        # top-1 agreement (benchmarks/RESULTS_QUANTIZED.md)
        return PT2EQuantizer(
            ComposableQuantizer([WeightOnlyInt8Quantizer((), embeddings=True), xnnpack_int8(dynamic=True).quantizer]),
            calibration,
        )
    import torch
    from torchao.quantization.pt2e.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer,
        get_default_x86_inductor_quantization_config,
    )

    # int8 weight-only for the RMSNorm-fed, outlier-carrying layers (q, k, v, MLP, lm_head) and the embedding; static
    # int8 on the other linears only: set global, X86InductorQuantizer also puts per-tensor int8 on every aten.mul
    # (the RMSNorm scaling, the rotary q * cos, SiLU(gate) * up). SmolLM2 on OpenVINO, 4 evaluation prompts: MLP
    # weight-only 86.7 %, + q, k, v, lm_head 89.8 %, and linears only 93.4 %
    weight_only = WeightOnlyInt8Quantizer(NORM_FED_MODULES, embeddings=True)
    x86 = X86InductorQuantizer().set_module_type_qconfig(
        torch.nn.Linear, get_default_x86_inductor_quantization_config()
    )
    return PT2EQuantizer(ComposableQuantizer([weight_only, x86]), calibration)


def _torchao_8da4w() -> ExportQuantizer:
    """``torchao-8da4w``: the linears 8da4w (groups of 32); the lm_head, down projections and embedding as the
    TORCHAO_* settings (measured) say."""
    import torch
    from torchao.quantization import Int8DynamicActivationIntxWeightConfig, IntxWeightOnlyConfig
    from torchao.quantization.granularity import PerAxis, PerGroup

    from .torchao import TorchAOQuantizer

    linears = Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int4, weight_granularity=PerGroup(32), intx_choose_qparams_algorithm=TORCHAO_QPARAMS
    )
    lm_head = {
        "int4": linears,
        "int8": Int8DynamicActivationIntxWeightConfig(
            weight_dtype=torch.int8, weight_granularity=PerAxis(0), intx_choose_qparams_algorithm=TORCHAO_QPARAMS
        ),
        "float": None,
    }[TORCHAO_LM_HEAD]
    embedding = None if TORCHAO_EMBEDDING is None else IntxWeightOnlyConfig(
        weight_dtype=torch.int8 if TORCHAO_EMBEDDING == "int8" else torch.int4,
        granularity=PerAxis(0) if TORCHAO_EMBEDDING == "int8" else PerGroup(32),
    )
    int8 = Int8DynamicActivationIntxWeightConfig(
        weight_dtype=torch.int8, weight_granularity=PerAxis(0), intx_choose_qparams_algorithm=TORCHAO_QPARAMS
    )
    modules = {LM_HEAD_MODULES[0]: lm_head}
    if TORCHAO_INT8_DOWN:
        modules[DOWN_PROJ_MODULES[0]] = int8
    return TorchAOQuantizer(linears, module_configs=modules, embedding_config=embedding,
                            float_zero_points=TORCHAO_FLOAT_ZERO_POINTS)


def _nncf(name: str, fmt: Any, calibration: Iterable[dict] | None) -> ExportQuantizer:
    import nncf

    from .nncf import (
        NNCFOnnxQuantizer,
        NNCFOpenVINOQuantizer,
        NNCFQuantizationConfig,
        NNCFTorchFXQuantizer,
        NNCFWeightCompressionConfig,
    )

    cls = {ExportFormat.ONNX: NNCFOnnxQuantizer, ExportFormat.OPENVINO: NNCFOpenVINOQuantizer}.get(
        fmt, NNCFTorchFXQuantizer
    )
    if name == "nncf-int4":
        # data-aware on OpenVINO when there are prompts: AWQ (activation-aware per-channel scales) and scale
        # estimation (each group's scale fitted to the layer's output on them); data-free int4 keeps 74 % of
        # SmolLM2's top-1 (benchmarks/RESULTS_QUANTIZED.md)
        aware = {"awq": True, "scale_estimation": True} if fmt == ExportFormat.OPENVINO and calibration else {}
        config = NNCFWeightCompressionConfig(mode=nncf.CompressWeightsMode.INT4_SYM, group_size=32, **aware)
        return cls(config, calibration_dataset=calibration)
    if name == "nncf-int8-weights":
        return cls(NNCFWeightCompressionConfig(mode=nncf.CompressWeightsMode.INT8_SYM))
    if fmt in (ExportFormat.DYNAMO, ExportFormat.EXECUTORCH):
        # weight-only on the FX graph: ExecuTorch lowers nothing else, and nncf.quantize fails on a Llama FX graph
        # in NNCF 3.4 (min-max statistics of the boolean mask, then SmoothQuant modules torch.export cannot re-trace)
        return cls(NNCFWeightCompressionConfig(mode=nncf.CompressWeightsMode.INT8_SYM))
    # int8 weight-only (float activations) for every RMSNorm-fed layer, as the ONNX Runtime recipes: SmolLM2, 4
    # evaluation prompts, with only the down projections (and, on ONNX, lm_head) weight-only: 91.8 % (OpenVINO) and
    # 90.2 % (ONNX) on one graph, but 83.6 % and 87.1 % through the static-cache decode loop
    weight_only = NORM_FED_MODULES + EMBEDDING_MODULES
    config = NNCFQuantizationConfig(advanced_parameters=_smooth_quant(SMOOTH_QUANT_ALPHA))
    return cls(config, calibration_dataset=calibration, weight_only_modules=weight_only)


def _smooth_quant(alpha: float) -> Any:
    """NNCF's advanced parameters with SmoothQuant's migration strength ``alpha`` on the MatMuls."""
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, AdvancedSmoothQuantParameters

    return AdvancedQuantizationParameters(smooth_quant_alphas=AdvancedSmoothQuantParameters(matmul=alpha))


def _ort_static_config() -> Any:
    """``quantize_static`` on the weights' ops only: by default it puts QDQ on every op, the rotary ``inv_freq`` and
    the RMSNorm weights included (per-tensor int8 flattens inv_freq: 0 % top-1 agreement on SmolLM2); and no QDQ on
    their outputs, which ONNX Runtime 1.32's QDQ propagation otherwise turns into an invalid ``QuantizeLinear``
    ("output_dtype INT8 does not match y_zero_point type UINT8") when a session loads the model."""
    from .onnxruntime import OnnxRuntimeStaticConfig

    ops = ["MatMul", "Gather"]
    return OnnxRuntimeStaticConfig(
        per_channel=True, op_types_to_quantize=ops, extra_options={"OpTypesToExcludeOutputQuantization": ops}
    )


def read_prompts(path: str | Path) -> list[str]:
    """The prompts of a JSONL file: one per line, a JSON string or an object with a ``"text"`` (or ``"prompt"``)
    field; blank lines are skipped.

    Raises:
        ValueError: A line that is neither, naming its number.
    """
    prompts = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not JSON ({e.msg})") from None
        if isinstance(value, dict):
            value = value.get("text", value.get("prompt"))
        if not isinstance(value, str):
            raise ValueError(f'{path}:{number}: expected a JSON string or an object with a "text" field')
        prompts.append(value)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def prompt_samples(prompts: Iterable[str], tokenizer: Any) -> list[dict[str, Any]]:
    """One input dict (``input_ids``, ``attention_mask``) per prompt, as calibration samples."""
    samples = []
    for prompt in prompts:
        encoded = tokenizer(prompt, return_tensors="pt")
        samples.append({k: encoded[k] for k in ("input_ids", "attention_mask") if k in encoded})
    return samples


def cli_quantizer(
    name: str | None, export_format: str, calibration: str | Path | None
) -> Callable[[Any], ExportQuantizer] | None:
    """For the CLI: check the recipe against the format and read the prompts now (before the model loads), and
    return ``make(tokenizer) -> quantizer`` that calibrates on the tokenized prompts; ``None`` without a recipe."""
    from ..errors import UnsupportedError

    if name is None:
        if calibration is not None:
            raise UnsupportedError("--calibration needs --quantize")
        return None
    try:
        recipe(name, export_format)
        prompts = read_prompts(calibration) if calibration is not None else None
    except OSError as e:
        raise UnsupportedError(f"cannot read --calibration {calibration}: {e}") from e
    except ValueError as e:
        raise UnsupportedError(str(e)) from e

    def make(tokenizer: Any) -> ExportQuantizer:
        if prompts is None:
            return recipe(name, export_format)
        if tokenizer is None:
            raise UnsupportedError("--calibration prompts need the model's tokenizer, and the model folder has none")
        return recipe(name, export_format, prompt_samples(prompts, tokenizer))

    return make
