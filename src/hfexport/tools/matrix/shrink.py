"""Tiny configs for any architecture: the config class's defaults, shrunk by generic rules plus a few overrides.
A model class whose ``config_class`` is a sub-config of the model type's (MusicGen's decoder) is built on it.

Sizes go to hidden 64, 2 layers, 4 heads (2 key/value heads), feed-forward 128, a 256-token vocabulary, 32-pixel
images in 8-pixel patches and 16 audio positions over 8 mel bins. Sub-configs (``text_config``, ``vision_config``,
``audio_config``, ``encoder``, ``decoder``...) are shrunk by the same rules. Special token ids that fall outside the
small vocabulary are renumbered: pad/bos/eos/start-like ids to 0, 1, 2, ... and placeholder ids (image, video,
audio tokens) from 255 down, so sampled text ids ``[3, 248)`` never hit a placeholder. Lists with one entry per
layer (``layer_types``...) are cut to the new layer count; a hybrid stack whose first layers are all linear attention
or SSM keeps one attention layer. Latent attention (``kv_lora_rank``) keeps its rotary head dim and one key/value
head per head; a multimodal rope's sections sum to half the rotary dims.

Size fields are shrunk by one table, :data:`SIZE_RULES` (set, cap or fill a field, by its exact name or by the kind
its name says; the first rule that reaches a field decides). When the config or model built by the plain rules
fails, :func:`build_model` tries once more with the rules marked ``fit`` as well: size fields the exact names miss
are capped by their name's kind (widths, channel lists and conv groups at 64, feed-forward sizes at 128,
vocabularies at 256, width/depth multipliers at 1, a detector's queries at 8); sizes left ``None`` by the defaults
(``head_dim``, expert counts...) get their tiny value; and, beside the table, a backbone keeps as many layers as its
``out_indices`` read, per-stage head lists become 4 each, ``per_layer_config`` loses the entries of removed layers,
a sub-model without SDPA gets eager attention, a sub-config's keys that its class derives from its fields are
recomputed (not passed back at the default's value), a set rule never grows a smaller default and a stack cut to
sliding layers keeps a full-attention one. Not applied on the first try (configs that build with the plain rules
stay as they were); the worker retries with them a model that builds but fails eagerly (``fit=True``).

:data:`OVERRIDES` (:mod:`.overrides`) holds what the rules cannot guess for a family; :data:`FROM_TINY_CASES` names
the families whose hand-written tiny model (``hfexport.testing.tiny``) is used instead, because their sample inputs
must agree with the config (image placeholders, grids).

Example:
    >>> config = tiny_config("llama")
    >>> (config.hidden_size, config.num_hidden_layers, config.vocab_size)
    (64, 2, 256)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from .overrides import FFN, HEAD_DIM, HEADS, HIDDEN, KV_HEADS, LAYERS, OVERRIDES, VOCAB

__all__ = ["OVERRIDES", "FROM_TINY_CASES", "SIZE_RULES", "SizeRule", "tiny_config", "build_model"]

MAX_PARAMETERS = 30_000_000
_LAYER_KEYS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "num_decoder_layers", "encoder_layers",
               "decoder_layers", "num_encoder_layers", "depth", "layers",  # (Kosmos-2's text model)
               "speech_encoder_layers", "t2u_encoder_layers", "t2u_decoder_layers", "conf_num_hidden_layers")
_HEAD_KEYS = ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
              "decoder_attention_heads")


@dataclass(frozen=True)
class SizeRule:
    """One shrinking rule: the size fields it reaches, by exact name or by a pattern of the name's kind, and what it
    does to them. ``set``: an int becomes ``value``; ``cap``: a number (of ``value``'s type) or a list of ints above
    ``value`` is lowered to it, smaller ones kept; ``fill``: a size the defaults leave ``None`` for a checkpoint to
    fill in gets ``value``. ``fit``: a rule of the second try only (:func:`build_model`)."""

    names: frozenset[str] | re.Pattern[str]
    op: str
    value: int | float
    fit: bool = False

    def reaches(self, key: str) -> bool:
        return key in self.names if isinstance(self.names, frozenset) else bool(self.names.search(key))

    def applies(self, value: Any) -> bool:
        if self.op == "fill":
            return value is None
        if isinstance(value, bool):
            return False
        if self.op == "set" or not isinstance(value, list):
            return isinstance(value, int if self.op == "set" else type(self.value))
        return bool(value) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)

    def __call__(self, value: Any) -> Any:
        """The new value (``value`` itself when the rule keeps it)."""
        if self.op != "cap":
            return self.value
        if isinstance(value, list):
            return [min(v, self.value) for v in value] if max(value) > self.value else value
        return self.value if value > self.value else value


def _named(op: str, value: int | float, names: str | tuple[str, ...], fit: bool = False) -> SizeRule:
    return SizeRule(re.compile(names) if isinstance(names, str) else frozenset(names), op, value, fit)


# the one table of size rules, first match decides (a field it reaches keeps its value where the rule says so): exact
# names first, then (second try only) the sizes by the kind their name says, which the exact names miss. Those are
# caps, not scales, so that sizes that must agree (a neck's channel list and the backbone's stage widths, a condition
# size and the backbone's hidden size, all larger than HIDDEN) still agree.
_HEAD_DIM_KEYS = ("head_dim", "d_kv", "attention_head_dim")
SIZE_RULES: tuple[SizeRule, ...] = (
    _named("set", HIDDEN, ("hidden_size", "d_model", "n_embd", "embed_dim", "dim", "out_hidden_size", "projection_dim",
                           "word_embed_proj_dim", "hidden_dim_text", "emb_dim", "d_latents",
                           "projection_hidden_size", "fpn_hidden_size")),
    # (Kimi-K2.5's projector norms the tower's width; SAM 2's mask decoder reads its vision neck at its own width)
    _named("set", HEADS, _HEAD_KEYS),
    _named("set", KV_HEADS, ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num")),
    _named("set", FFN, ("intermediate_size", "ffn_dim", "d_ff", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim",
                        "hidden_dim", "dim_ff", "d_inner", "ffn_hidden_size")),  # (CPM-Ant, XLNet, DBRX's)
    _named("set", 32, ("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size",
                       "moe_hidden_size")),
    _named("set", HEAD_DIM, _HEAD_DIM_KEYS),
    _named("set", 4, ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")),
    _named("set", 2, ("num_experts_per_tok", "moe_k", "top_k_experts")),
    _named("cap", VOCAB, ("vocab_size", "entity_vocab_size", "vocab_size_per_layer_input")),
    _named("cap", 256, ("max_position_embeddings", "n_positions", "max_speech_positions")),  # (SpeechT5: 4000)
    _named("cap", 512, ("context_length",)),  # a forecaster's input steps (TimesFM 2.5: 16384, 512 patches)
    _named("cap", 64, ("max_target_positions",)),
    _named("cap", 16, ("max_source_positions", "v_head_dim")),
    _named("cap", 8, ("num_mel_bins", "patch_size", "qk_rope_head_dim", "qk_nope_head_dim", "state_size",
                      "ssm_state_size")),
    _named("cap", 32, ("image_size", "crop_size", "kv_lora_rank", "q_lora_rank")),
    _named("cap", 4, ("frames_per_clip", "label_length", "attention_window")),  # (forecast labels <= context; LED)
    _named("cap", LAYERS, ("num_self_attends_per_block",)),
    # a layout embedding of 4 coordinates and 2 shape sizes, concatenated to the hidden size: 4 x 10 + 2 x 12 = 64
    _named("set", 10, ("coordinate_size",)), _named("set", 12, ("shape_size",)),
    # second try: sizes the defaults leave None
    _named("fill", HEAD_DIM, ("head_dim",), fit=True),
    _named("fill", KV_HEADS, ("num_key_value_heads",), fit=True),
    _named("fill", FFN, ("intermediate_size",), fit=True),
    _named("fill", 32, ("moe_intermediate_size",), fit=True),
    _named("fill", VOCAB, ("vocab_size",), fit=True),
    _named("fill", 4, ("prediction_length", "n_routed_experts", "num_experts"), fit=True),
    _named("fill", 2, ("num_experts_per_tok", "top_k_experts"), fit=True),
    _named("fill", 1, ("n_shared_experts",), fit=True),
    _named("fill", VOCAB - 1, ("image_token_index",), fit=True),  # BLIP-2's placeholder, None by default
    _named("fill", 8, ("sliding_window",), fit=True),  # Step-3.7's sliding layers find no window by default
    # a sine position embedding of 2 x num_pos_feats channels added to the hidden states (SAM's prompt/image)
    _named("cap", HIDDEN // 2, ("num_pos_feats",), fit=True),
    # a width a sub-config derives from its hidden size when left None, passed back at the default's value (ViT)
    _named("cap", HIDDEN, ("pooler_output_size",), fit=True),
    # a codec's base width, doubled at each of its down/upsampling stages (VibeVoice: 32 x 2^6 = 2048 channels)
    _named("cap", 4, ("num_filters", "n_filters"), fit=True),
    # layers reading another layer's cache: none of 2 layers (each kind must keep a layer that makes its cache)
    _named("cap", 0, ("num_kv_shared_layers",), fit=True),
    # validators of the second try's sizes: Molmo 2 reads vision layers [24, 18] of 2, dots3's adapter maps the
    # vision width to the text width, EfficientLoFTR's hidden size is its last stage's, LW-DETR's windows tile a
    # 32-pixel image
    _named("cap", LAYERS - 1, ("vision_feature_layer",), fit=True),
    _named("cap", HIDDEN, ("adapter_in_dim", "adapter_input_size", "adapter_out_dim", "out_features"), fit=True),
    _named("cap", 4, ("num_windows",), fit=True),
    # second try: sizes by their name's kind
    _named("cap", 1.0, ("width_coefficient", "depth_coefficient", "width_multiplier", "depth_multiplier"), fit=True),
    _named("cap", 8, ("num_queries",), fit=True),  # a detector's top-k over the 21 tokens of a 32-pixel image
    _named("cap", FFN, r"(intermediate_size|intermediate_dim|ffn_dim|ffn_hidden_size|ffn_size|mlp_dim|"
                       r"mlp_hidden_size|feed_forward_hidden_size|feed_forward_size|inner_dim)", fit=True),
    _named("cap", HIDDEN, r"(hidden_size|hidden_dim|embed_dim|embedding_dim|embedding_size|channels|channel_list|"
                          r"condition_dim|proj_size|projection_size|output_dim|quantization_dim|codebook_dim|"
                          r"conv_dim|tdnn_dim|d_model|feature_dim|model_dim|latent_dim|bottleneck_size|"
                          r"_groups$)",  # groups <= width
           fit=True),
    _named("cap", VOCAB, "vocab", fit=True),
)

# per-layer kinds of a hybrid stack, and those of them that attend over a key/value cache
_LAYER_TYPE_KEYS = ("layer_types", "layers_block_type", "block_types")
_ATTENTION_KINDS = ("full_attention", "sliding_attention", "chunked_attention", "indexed_attention",
                    "window_attention", "attention", "hybrid", "hybrid_sliding")
# text models whose modeling code falls back to a full-size mrope_section when the config has none
_DEFAULT_MROPE = ("glm4v_text", "glm4v_moe_text", "glm_image_text", "glm_ocr_text", "paddleocr_vl_text",
                  "hunyuan_vl_text", "qwen2_vl_text", "qwen2_5_vl_text", "qwen2_5_omni_text",
                  "qwen3_omni_moe_text")  # (HunYuan-VL's: none at all)
_LOW_TOKENS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "sep_token_id",
               "cls_token_id", "unk_token_id", "mask_token_id")
_TOKEN_LISTS = ("suppress_tokens", "begin_suppress_tokens", "forced_decoder_ids")

# model_type -> hfexport.testing.tiny case used instead of the generic rules
FROM_TINY_CASES: dict[str, str] = {"qwen2_vl": "qwen2_vl", "llava": "llava"}


def _is_config(value: Any) -> bool:
    from transformers import PreTrainedConfig

    return isinstance(value, PreTrainedConfig)


def _token_ids(values: dict[str, Any], vocab: int) -> dict[str, Any]:
    """Renumber the special token ids of one (sub)config that do not fit in ``vocab``."""
    renumbered: dict[int, int] = {}
    low, high = iter(range(VOCAB)), iter(range(VOCAB - 1, -1, -1))
    out: dict[str, Any] = {}

    def fix(key: str, tid: Any) -> Any:
        if not isinstance(tid, int) or isinstance(tid, bool) or tid < vocab:
            return tid
        if tid not in renumbered:
            renumbered[tid] = next(low if key in _LOW_TOKENS else high)
        return renumbered[tid]

    keys = sorted(values, key=lambda k: (k not in _LOW_TOKENS, _LOW_TOKENS.index(k) if k in _LOW_TOKENS else 0, k))
    for key in keys:
        value = values[key]
        if key in _TOKEN_LISTS and value:
            out[key] = None
        elif key.endswith(("_token_id", "_token_index", "_token_ids")):
            if isinstance(value, list):
                new = [fix(key, v) for v in value]
                if new != value:
                    out[key] = new
            elif (new := fix(key, value)) != value:
                out[key] = new
    return out


def _layers(values: dict[str, Any], layers_before: int | None, fit: bool) -> int:
    """The new layer (or stage) count: :data:`LAYERS`, or with ``fit`` as many as a backbone's ``out_indices``
    point into (a ViT backbone read at layer 12, a Swin one at its 4th stage) so its feature maps still exist."""
    indices = values.get("out_indices")
    if fit and layers_before and isinstance(indices, list) and indices and all(isinstance(i, int) for i in indices):
        return min(layers_before, max(LAYERS, *indices))
    return LAYERS


def _shrunk(values: dict[str, Any], layers_before: int | None, fit: bool = False) -> dict[str, Any]:
    """The overrides for one (sub)config, given its values (``to_dict()``) and its original layer count; ``fit``
    adds the rules of the second try (:func:`build_model`)."""
    out: dict[str, Any] = {}
    layers, hybrid = _hybrid_layers(values, _layers(values, layers_before, fit), fit)
    for key, value in values.items():
        if isinstance(value, bool):
            continue
        if key in _LAYER_KEYS and isinstance(value, int):
            if value != layers:
                out[key] = layers
        elif fit and key in _HEAD_KEYS and isinstance(value, list) and value and all(isinstance(v, int) for v in value):
            out[key] = [HEADS] * len(value)  # heads per stage (Swin): each stage's width divides by HEADS
        elif fit and key == "per_layer_config" and isinstance(value, dict):  # entries of layers no longer there
            out[key] = {k: v for k, v in value.items() if str(k).isdigit() and int(k) < layers}
        elif isinstance(value, list) and layers_before and len(value) == layers_before and layers_before > layers:
            out[key] = _per_layer_heads(key, value[:layers], values) or value[:layers]
        elif (rule := _rule(key, value, fit)) is not None and (new := rule(value)) != value:
            if not (fit and rule.op == "set" and isinstance(value, int) and 0 < value < new):
                out[key] = new  # (second try: a set never grows a default, ZAYA routes to 1 expert only)
    out.update(hybrid)
    depths, width = out.get("depths", values.get("depths")), values.get("patch_embeds_hidden_size")
    if isinstance(depths, list) and depths and isinstance(width, int) and "hidden_size" in out:
        # a hierarchical audio tower (CLAP's HTSAT) doubling its width per stage into a hidden_size-wide projection
        out["patch_embeds_hidden_size"] = max(out["hidden_size"] >> (len(depths) - 1), 1)
    stages = [v for k, v in values.items() if k.endswith("_per_stage") and "dim" in k and isinstance(v, list) and v]
    if "hidden_size" in out and any(s[0] == values.get("hidden_size") for s in stages):
        del out["hidden_size"]  # the first stage's width, which the per-stage list keeps (SAM 2's Hiera: 96)
    rope_dim = values.get("qk_rope_head_dim")
    if isinstance(rope_dim, int) and values.get("head_dim") == rope_dim:  # multi-head latent attention's rotary dim
        out["head_dim"] = out.get("qk_rope_head_dim", rope_dim)
    if isinstance(values.get("kv_lora_rank"), int) and isinstance(values.get("num_key_value_heads"), int):
        out["num_key_value_heads"] = HEADS  # latent attention expands its keys to every head: no grouping
    rope = values.get("rope_parameters") or values.get("rope_scaling")
    if isinstance(rope, dict) and ("mrope_section" in rope or values.get("model_type") in _DEFAULT_MROPE):
        key = "rope_parameters" if values.get("rope_parameters") else "rope_scaling"
        half = int(HEAD_DIM * rope.get("partial_rotary_factor", 1.0)) // 2  # the sections split half the rotary dims
        out[key] = {**rope, "mrope_section": [half - 2 * ((half + 1) // 3), (half + 1) // 3, (half + 1) // 3]}
    types = out.get("layer_types", values.get("layer_types"))
    if values.get("rope_parameters") == {} and isinstance(types, list) and types:
        # RoPE per layer type left empty by the defaults (CohereCompass, transformers 5.23: "no RoPE parameters were
        # found"), while the rotary module reads rope_parameters[layer_type]: a default RoPE for each type
        out["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": 10000.0} for t in dict.fromkeys(types)}
    for key, value in values.items():  # nested sub-configs, e.g. the language model inside a VLM's text_config
        if isinstance(value, dict) and "model_type" in value:
            out[key] = {**value, **_shrunk(value, _layer_count(value), fit)}
    sizes, before = values.get("backbone_feature_sizes"), _side(values.get("backbone_config"))
    after = _side(out.get("backbone_config"))
    if isinstance(sizes, list) and before and after and after < before:  # a neck's feature map sides (SAM 2's), in
        out["backbone_feature_sizes"] = [[max(1, v * after // before) for v in s] for s in sizes]  # pixels' scale
    pinpoints, vision = values.get("image_grid_pinpoints"), values.get("vision_config")
    if isinstance(pinpoints, list) and isinstance(vision, dict) and isinstance(base := vision.get("image_size"), int):
        side = out.get("vision_config", vision).get("image_size", base)  # LLaVA-NeXT's crop grids are in units of
        if side != base and all(len(p) == 2 for p in pinpoints):  # the tower's image size: kept in those units
            flat = [v for p in pinpoints for v in p]  # (else their own: Granite 4 Vision's, 336s beside a 224 tower)
            unit = base if all(v % base == 0 for v in flat) else math.gcd(*flat)
            out["image_grid_pinpoints"] = [[h * side // unit, w * side // unit] for h, w in pinpoints]
    vocab = min(values.get("vocab_size") or VOCAB, VOCAB) if isinstance(values.get("vocab_size"), int) else VOCAB
    out.update(_token_ids(values, vocab))
    return out


def _per_layer_heads(key: str, kept: list[Any], values: dict[str, Any]) -> list[int] | None:
    """A per-layer list of head counts (its name says heads) in the tiny model's heads: a layer with as many as
    the config's ``num_attention_heads`` gets :data:`HEADS`, a grouped one :data:`KV_HEADS` (Sapiens 2 derives
    ``num_key_value_heads_per_layer`` from its 16 heads at the defaults: cut to 2 layers it still said 16 for 4)."""
    heads = values.get("num_attention_heads")
    if "heads" not in key or not isinstance(heads, int) or not all(type(v) is int for v in kept):
        return None
    return [HEADS if v >= heads else KV_HEADS for v in kept]


def _side(config: Any) -> int | None:
    """A (sub)config's image side (``image_size`` as an int or ``[h, w]``), ``None`` where it has none."""
    size = config.get("image_size") if isinstance(config, dict) else None
    size = size[0] if isinstance(size, list) and size else size
    return size if isinstance(size, int) and not isinstance(size, bool) else None


def _rule(key: str, value: Any, fit: bool) -> SizeRule | None:
    """The rule of :data:`SIZE_RULES` that decides ``key``'s value (``fit``: the second try's rules too)."""
    return next((r for r in SIZE_RULES if (fit or not r.fit) and r.reaches(key) and r.applies(value)), None)


def _hybrid_layers(values: dict[str, Any], layers: int, fit: bool = False) -> tuple[int, dict[str, Any]]:
    """The layer count and overrides that keep one attention layer in a hybrid stack whose first ``layers`` layers
    are all linear attention, SSM, convolution or MLP (Qwen3-Next: 3 of 4 layers linear; Jamba: attention every 8th
    layer, from the 5th). Without one, transformers' own generate() fails ("get_seq_length can only be called on
    Attention layers"), and the stack would not exercise both kinds of cache. The last kept layer becomes the first
    attention-like one, or, where that layer's kind would then be gone (Nemotron-H: Mamba, then MoE), one more
    layer is added. With ``fit``, a stack cut to sliding layers only gets its last layer back as
    ``full_attention`` where the full stack has one (NeoMME's validator asks for one)."""
    out: dict[str, Any] = {}
    keys = [k for k in _LAYER_TYPE_KEYS if isinstance(values.get(k), list) and values[k]
            and all(isinstance(t, str) for t in values[k])]
    if keys:
        types = values[keys[0]]
        head = types[:layers]
        first = next((t for t in types if t in _ATTENTION_KINDS), None)
        if first is not None and len(head) == layers and not any(t in _ATTENTION_KINDS for t in head):
            kept = [*head[:-1], first] if head[-1] in head[:-1] else [*head, first]
            layers = len(kept)
            out.update(dict.fromkeys(keys, kept))
        elif fit and "full_attention" in types and len(head) == layers and "full_attention" not in head:
            out.update(dict.fromkeys(keys, [*head[:-1], "full_attention"]))  # NeoMME: sliding layers need a global one
    period, offset = values.get("attn_layer_period"), values.get("attn_layer_offset")
    if isinstance(period, int) and isinstance(offset, int) and offset >= layers:
        out.update(attn_layer_period=layers, attn_layer_offset=layers - 1)
    for key in ("attn_layer_indices", "hybrid_layer_ids"):
        indices = values.get(key, 0)
        if indices is None or (isinstance(indices, list) and not any(i < layers for i in indices)):
            out[key] = [layers - 1]
    return layers, out


def _layer_count(values: dict[str, Any]) -> int | None:
    for key in ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers", "encoder_layers"):
        if isinstance(values.get(key), int):
            return values[key]
    return None


def _derived(config_class: Any, values: dict[str, Any], shrunk: dict[str, Any]) -> set[str]:
    """The keys of a sub-config's ``values`` that its class computes from its fields (SAM's prompt encoder:
    ``image_embedding_size = image_size // patch_size``) and the rules left alone: passed back as they were, they
    would override what the shrunk fields make of them."""
    import dataclasses

    if not dataclasses.is_dataclass(config_class):
        return set()
    fields = {f.name for f in dataclasses.fields(config_class)}
    kept = ("model_type", "out_features", "out_indices", "stage_names")  # a backbone's choice of stages: no derivation
    return {k for k in values if k not in fields and k not in shrunk and not k.startswith("_") and k not in kept}


def tiny_config(model_type: str, fit: bool = False) -> Any:
    """The shrunk config of ``model_type`` (defaults of its config class, then the rules, then :data:`OVERRIDES`).

    ``fit`` adds rules that only the second try of :func:`build_model` uses, so that the configs that build with
    the plain rules stay what they were: a backbone keeps as many layers as its ``out_indices`` read, per-stage
    head lists become :data:`HEADS` each, ``per_layer_config`` entries of removed layers go.
    """
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    default = config_class()
    values = default.to_dict()
    kwargs = _shrunk(values, _layer_count(values), fit)
    for key, sub in list(vars(default).items()):  # (no getattr: a heterogeneous config refuses per-layer reads)
        if _is_config(sub):
            sub_values = sub.to_dict()
            shrunk = _shrunk(sub_values, _layer_count(sub_values), fit)
            derived = _derived(type(sub), sub_values, shrunk) if fit else set()
            kwargs[key] = {**{k: v for k, v in sub_values.items() if k not in derived}, **shrunk}
    return config_class(**_merged(kwargs, OVERRIDES.get(model_type, {})))


def _merged(values: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``override``'s entries, a dict merged into a dict at any depth (a sub-config's own)."""
    out = dict(values)
    for key, value in override.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


_CAUSAL_SUFFIXES = ("ForCausalLM", "Decoder", "LMHeadModel")


def build_model(model_type: str, class_name: str, fit: bool | None = None) -> Any:
    """A seeded, eval-mode, fp32 tiny instance of ``class_name`` with a greedy generation config.

    When the plain rules give a config or model that does not build, a second try adds the ``fit`` rules of
    :func:`tiny_config`; if that fails too, its error is raised with the first one as its cause. ``fit=True``: the
    second try's rules only (the worker's retry of a model that builds but does not run eagerly); ``None`` when
    they give the same config as the plain rules (nothing to retry) or the family has a hand-written case.
    """
    if model_type in FROM_TINY_CASES:
        from ...testing.tiny import tiny_model

        return None if fit else tiny_model(FROM_TINY_CASES[model_type])
    import transformers

    cls = getattr(transformers, class_name)  # an AttributeError here is no matter of rules: no second try
    if fit:
        config = tiny_config(model_type, fit=True)
        try:
            same = config.to_dict() == tiny_config(model_type).to_dict()
        except Exception:  # noqa: BLE001 - the plain rules give no config: the model was built on these rules
            return None
        return None if same else _build(cls, config)
    try:
        return _build(cls, tiny_config(model_type))
    except Exception as first:  # noqa: BLE001 - any failure of the plain rules gets the second try
        try:
            return _build(cls, tiny_config(model_type, fit=True))
        except Exception as second:  # noqa: BLE001
            if str(second) == str(first):
                raise first from None
            raise second from first


def _build(cls: Any, config: Any) -> Any:
    import torch
    from transformers import GenerationConfig

    from .weights import lift_vanishing_convs, lift_vanishing_norms, seed_zero_routers

    wanted = getattr(cls, "config_class", None)
    if isinstance(wanted, type) and not isinstance(config, wanted):  # a decoder class of a composite model type
        # (MusicgenForCausalLM of "musicgen" takes the MusicgenDecoderConfig inside it)
        config = next((v for v in vars(config).values() if isinstance(v, wanted)), config)
    if cls.__name__.endswith(_CAUSAL_SUFFIXES) and getattr(config, "is_decoder", None) is False:
        # a BERT-style decoder class (BertGenerationDecoder, RobertaForCausalLM...) is causal, with a cache, only
        # with is_decoder=True, which transformers asks a standalone user to set ("add `is_decoder=True`")
        config.is_decoder = True
    attn = "sdpa" if getattr(cls, "_supports_sdpa", False) else "eager"
    with torch.device("meta"):  # count first: a sub-config the rules missed can mean gigabytes
        try:
            meta = cls._from_config(config, attn_implementation=attn)
        except ValueError as e:  # a sub-model (a CNN backbone) without SDPA refuses the whole model's choice
            if attn != "sdpa" or "does not support an attention implementation" not in str(e):
                raise
            attn = "eager"
            meta = cls._from_config(config, attn_implementation=attn)
        if _values_ungrouped(meta) and _ungroup(config):
            meta = cls._from_config(config, attn_implementation=attn)
        size = sum(p.numel() for p in meta.parameters())
    if size > MAX_PARAMETERS:
        raise ValueError(f"the shrunk model still has {size / 1e6:.0f}M parameters (> {MAX_PARAMETERS / 1e6:.0f}M): "
                         "a size field the shrinking rules do not know")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = cls._from_config(config, attn_implementation=attn, dtype=torch.float32)
        seed_zero_routers(model)
        lift_vanishing_norms(model)
        lift_vanishing_convs(model)
    model.eval()
    if model.can_generate():
        # the top-level value first: Whisper's get_text_config() answers a decoder config with default ids
        text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
        ids = {k: getattr(config, k, None) if getattr(config, k, None) is not None else getattr(text, k, None)
               for k in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")}
        if getattr(config, "is_encoder_decoder", False) and ids["decoder_start_token_id"] is None:
            ids["decoder_start_token_id"] = ids["pad_token_id"] or 0  # T5's convention; generate() needs one
        model.generation_config = GenerationConfig(do_sample=False, **{k: v for k, v in ids.items() if v is not None})
    return model


def _values_ungrouped(model: Any) -> bool:
    """Whether an attention layer projects its keys and values to different widths: a family that sizes its keys by
    ``num_key_value_heads`` and its values by ``num_attention_heads`` (Nemotron-3 Diarization and Transcribe audio
    encoders, whose checkpoints have as many of each) and only "runs" grouped because eager SDPA reads the value heads
    off the tensor, which no export's attention does ("Attempting to broadcast a dimension of length 8")."""
    import torch

    def widths(m: Any) -> tuple[int, ...]:
        projections = [getattr(m, f"{x}_proj", None) for x in "qkv"]
        return tuple(p.out_features for p in projections) if all(
            isinstance(p, torch.nn.Linear) for p in projections) else ()

    # values as wide as the queries, keys narrower (a linear attention's own widths, OLMo-Hybrid's, are left alone)
    return any(w and w[0] == w[2] != w[1] for w in map(widths, model.modules()))


def _ungroup(config: Any, seen: set[int] | None = None) -> bool:
    """As many key/value heads as heads in ``config`` and its sub-configs; whether any changed."""
    seen = set() if seen is None else seen
    if id(config) in seen:
        return False
    seen.add(id(config))
    changed = False
    heads, groups = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    if isinstance(heads, int) and isinstance(groups, int) and groups < heads:
        config.num_key_value_heads = heads
        changed = True
    for value in vars(config).values():
        if _is_config(value):
            changed = _ungroup(value, seen) or changed
    return changed



