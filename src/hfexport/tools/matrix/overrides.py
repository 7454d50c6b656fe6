"""Per-family config overrides of the matrix's shrinking rules: what the generic size rules of :mod:`.shrink` get
wrong for one family (sizes that must agree, fields a default config leaves unset, ids its processor owns)."""

from __future__ import annotations

from typing import Any

__all__ = ["OVERRIDES", "IMAGE_PROCESSOR_KWARGS", "GENERATE_ONE_ROW", "HIDDEN", "FFN", "LAYERS", "HEADS", "KV_HEADS",
           "HEAD_DIM", "VOCAB"]

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 64, 128, 2, 4, 2, 16, 256

_QSA_INDEXER = {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM, "indexer_budget": 8,
                "indexer_compress_ratio": 4}
# The token names of a VQ image codebook of 64 codes in a 256-token vocabulary (ids 128..191), as the processors'
# vocabularies spell them: Chameleon's "IMGIMG<code in letters A-J>Z", Emu3's "<|visual token000123|>"; their
# default configs leave the map unset, and the models read the image token (255) and the codes from it
_IMAGE_CODES = 64
_CHAMELEON_VOCAB = {"<image>": VOCAB - 1, **{
    "IMGIMG" + "".join(chr(ord("A") + int(c)) for c in str(i)) + "Z": 128 + i for i in range(_IMAGE_CODES)}}
_EMU3_VOCAB = {"<image>": VOCAB - 1, "<|extra_200|>": VOCAB - 2,
               **{f"<|visual token{i:06d}|>": 128 + i for i in range(_IMAGE_CODES)}}
# a timm ViT's width, depth and heads; its position embedding, fixed to the image size it is built for (336 pixels),
# resampled to the image's, padded to whole patches
_TIMM_VIT = {"embed_dim": HIDDEN, "depth": LAYERS, "num_heads": HEADS, "dynamic_img_size": True, "dynamic_img_pad": True}
# model_type -> config kwargs the generic rules get wrong for that family (a dict is merged into the sub-config, at
# any depth)
OVERRIDES: dict[str, dict[str, Any]] = {
    "gemma3_text": {"sliding_window": 8, "query_pre_attn_scalar": HEAD_DIM},
    "mamba": {"tie_word_embeddings": False},
    "mamba2": {"num_heads": 8, "n_groups": 1, "tie_word_embeddings": False},  # heads x head_dim = expand x hidden
    "whisper": {"init_std": 0.2, "tie_word_embeddings": False, "decoder_start_token_id": 3, "pad_token_id": 0,
                "bos_token_id": 1, "eos_token_id": 2},  # Whisper's own ids are one id for all three
    "gemma3": {"mm_tokens_per_image": 4},  # 16 patches of 32-pixel images pooled 2 x 2
    "voxtral": {"audio_token_id": 255},  # its config leaves the audio token to the processor's tokenizer
    "instructblipvideo": {"video_token_index": 255},  # (as Voxtral's audio token)
    # (its ids as Voxtral's audio token; the widths its pixel-shuffle projector reads, which no rule names)
    "kosmos-2.5": {"latent_query_num": 8},  # its image fills 2048 positions of the prompt by default
    "molmo2": {"image_patch_id": VOCAB - 6},  # (its image token, 151938; no "_token_id" name for the renumbering)
    "nemotron_h_omni": {"image_token_id": 255, "video_token_id": 254, "audio_token_id": 253,
                        "vision_hidden_size": HIDDEN, "projector_hidden_size": HIDDEN},
    **dict.fromkeys(("minicpm_ocr", "minicpmv4_6", "minicpmv4_7"), {"image_token_id": 255, "video_token_id": 254}),
    # its image and document ids (6, 5) lie among the sampled text ids: out of their way, as the renumbered ones
    "neomme": {"image_token_id": 255, "document_token_id": 254},
    # the vision adapter's input is the tower's width after its pixel shuffle (by 2 x 2 here: 4 x 64), its output
    # the projector's input
    "llama4": {"vision_config": {"intermediate_size": 4 * HIDDEN, "projector_input_dim": HIDDEN,
                                 "projector_output_dim": HIDDEN, "vision_output_dim": HIDDEN}},
    "aria": {"projector_patch_to_query_dict": {16: 4}},  # 16 patches of a 32-pixel image -> 4 query tokens
    # (None by default: the plain rules' model did not build, and the second try's lost the experts: one expert,
    # whose token count histc(min=0, max=0) no exporter converts)
    "hunyuan_v1_moe": {"head_dim": HEAD_DIM},
    "muse_spark": {"out_hidden_size": 4 * HIDDEN, "projector_hidden_size": HIDDEN},
    "muse_glimmer": {"out_hidden_size": 4 * HIDDEN, "projector_hidden_size": HIDDEN},
    "qwen3_asr": {"audio_config": {"output_dim": HIDDEN}},  # the projection into the text model's width
    # at the default 0.02 its tiny decoder repeats one token whatever the prompt: no test of the audio merge
    "moss_transcribe_diarize": {"initializer_range": 0.2, "text_config": {"initializer_range": 0.2}},
    "esm": {"pad_token_id": 1},  # its padding mask compares ids with it (None by default)
    "esmc": {"num_key_value_heads": HEADS},  # its validator refuses grouped-query attention
    # its conformer attention does not run grouped (4 heads over 2 key/value heads fail at run time)
    "granite_speech5_encoder": {"num_key_value_heads": HEADS},
    "granite_speech5_ctc": {"encoder_config": {"num_key_value_heads": HEADS}},
    "t5": {"relative_attention_num_buckets": 8, "relative_attention_max_distance": 32},
    # its head convolution is round_filters(1280) wide, hard-coded, and hidden_dim must equal it (B0 multipliers)
    "efficientnet": {"width_coefficient": 1.0, "depth_coefficient": 1.0, "hidden_dim": 1280},
    "lilt": {"hidden_size": 96},  # its layout embedding is 6 slices of hidden_size // 6: a multiple of 6
    # its cache's q/k width is hidden x qk_dim_factor rounded up to a multiple of 64, its layers' is not rounded
    "xlstm": {"qk_dim_factor": 1.0},
    # axial position embeddings: widths that sum to hidden_size, a grid of max_position_embeddings positions
    "reformer": {"axial_pos_embds_dim": [HIDDEN // 2, HIDDEN // 2], "axial_pos_shape": [16, 16]},
    "codegen": {"rotary_dim": HEAD_DIM // 2},  # rotates 64 dims by default: more than a head has
    "gptj": {"rotary_dim": HEAD_DIM // 2},
    # defaults to a pure-Mamba stack; Granite 4.0-H mixes in attention layers
    "granitemoehybrid": {"layer_types": ["linear_attention", "full_attention"]},
    # no layer types by default, which its decoder layers index: one short-convolution and one attention layer
    "lfm2_moe": {"layer_types": ["conv", "full_attention"]},
    # the acoustic encoder's width doubles at each of its 5 downsampling blocks from encoder_hidden_size (48: 1536
    # channels at the end, 35M parameters); the quantizer reads the acoustic and semantic widths side by side
    # (its attention does not run grouped)
    "xcodec2": {"encoder_hidden_size": 8, "quantization_dim": 2 * HIDDEN, "num_key_value_heads": HEADS},
    "neucodec": {"encoder_hidden_size": 8, "quantization_dim": 2 * HIDDEN, "num_key_value_heads": HEADS},
    # its rotary embedding turns max(projection_dim // (2 x heads), 32) dims: a head as wide as that (32, 2 heads)
    "clvp": {"text_config": {"num_attention_heads": 2}, "speech_config": {"num_attention_heads": 2}},
    # its decoder's cross-attention reads the encoder's states: their width and heads, not the 1024-wide default's
    "dia": {"decoder_config": {"cross_hidden_size": HIDDEN, "cross_num_attention_heads": HEADS,
                               "cross_num_key_value_heads": HEADS, "cross_head_dim": HEAD_DIM}},
    # its vocoder reads the spectrogram its acoustic model writes (80 mel bins by default, 8 once shrunk)
    "fastspeech2_conformer_with_hifigan": {"vocoder_config": {"model_in_dim": 8}},
    # X-Codec's codebooks hold the acoustic and the semantic features side by side (its default derives the sum)
    "xcodec": {"codebook_dim": 2 * HIDDEN},
    # its validator: text hidden // 4; (as MOSS's) a tiny decoder at 0.02 repeats one token whatever the audio
    "fun_asr_nano": {"adaptor_config": {"intermediate_size": HIDDEN // 4}, "initializer_range": 0.2,
                     "text_config": {"initializer_range": 0.2}},
    "chameleon": {"vocabulary_map": _CHAMELEON_VOCAB, "vq_config": {"num_embeddings": _IMAGE_CODES}},
    "emu3": {"vocabulary_map": _EMU3_VOCAB, "vq_config": {"codebook_size": _IMAGE_CODES}},
    "deepseek_ocr2": {"text_config": {"mlp_layer_types": ["dense", "sparse"]}},
    # its CLIP tower takes the SAM neck's last channels as its patch embeddings: they must be its hidden size
    "unlimited_ocr": {"vision_config": {"sam_config": {"downsample_channels": [HIDDEN // 2, HIDDEN]}}},
    # its high-resolution SAM tower reads the hidden state after its first global-attention layer (11th by default)
    "deepseek_vl_hybrid": {"high_res_vision_config": {"global_attn_indexes": [1]}},
    # the vision layers its language model's deepstack taps (3, 7, 10 by default: none of 2 layers)
    "granite_docling": {"vision_config": {"deepstack_visual_indexes": [0, 1]}},  # unset by default, indexed per layer
    # its text config takes dropout_rate from the encoder-decoder config, which the standalone encoder lacks
    "t5gemma2_encoder": {"text_config": {"dropout_rate": 0.0}, "mm_tokens_per_image": 4},
    # unset by default: which vision layers feed which decoder layers, and the Q-Former's window ratio
    "granite4_vision": {"deepstack_layer_map": [[0, 0], [1, 1]], "spatial_target_layers": [0, 1, 0, 1],
                        "downsample_rate": "1/2"},
    # the thinkers' rope index reads vision_start_token_id, which their configs (5.23) do not define: an id the
    # shrinking rules left free
    "qwen2_5_omni_thinker": {"vision_start_token_id": 249},
    "qwen3_omni_moe_thinker": {"vision_start_token_id": 250},
    # its shared transformer block is tied across hybrid layers: one needs a second to tie to
    "zamba": {"layers_block_type": ["hybrid", "hybrid"]},
    # routers: top-k unset by default (DeepSeek-V2), more experts per token than the 4 kept (Kimi Linear), more
    # expert groups than experts (AXK1)
    "deepseek_v2": {"num_experts_per_tok": 2},
    "kimi_linear": {"num_experts_per_token": 2},
    "axk1": {"n_group": 2, "topk_group": 1},
    # its attention layers select tokens through an indexer that is off by default ("indexed_attention" needs it)
    "qwen4_exp_text": _QSA_INDEXER,
    "qwen4_exp": {"text_config": _QSA_INDEXER},  # a dict for a sub-config is merged into it
    # its rope falls back to a full-size [h, w, t] section ([22, 22, 20]) and splits h and w equally
    "ernie4_5_vl_moe": {"text_config": {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0,
                                                            "mrope_section": [3, 3, 2]}}},
    # default configs whose model reads a field they do not set (transformers 5.23): DBRX's attention reads
    # rope_theta and clamps by clip_qkv, Moonshine-Streaming's decoder num_key_value_heads, BLT num_hidden_layers
    "dbrx": {"attn_config": {"rope_theta": 10000.0, "clip_qkv": 8.0}},
    "moonshine_streaming": {"num_key_value_heads": HEADS},
    "blt": {"num_hidden_layers": LAYERS},
    "shieldgemma2": {"mm_tokens_per_image": 4},  # (Gemma 3's: 16 patches pooled 2 x 2)
    "vipllava": {"vision_feature_layers": [-1, -2]},  # 5 layers of a 24-layer tower by default
    # timm towers (TimmWrapper, TimmBackbone): their size is their architecture's, which no size field says: a small
    # variant of the same family or timm's own width and depth arguments (model_args), and the widths read off it
    "fast_vlm": {"vision_config": {"architecture": "fastvit_mci0", "hidden_size": 1024}},  # mci3: 123M, 3072 wide
    # MobileNetV5: 294M -> 16M at 1/8 of its channels, still 2048 wide at the end (the config's hidden_size must say
    # it), and any image pooled to 16 x 16 = 256 soft tokens (as the config's count must)
    "gemma3n": {"vision_config": {"model_args": {"channel_multiplier": 0.125}, "hidden_size": 2048},
                "vision_soft_tokens_per_image": 256},
    "gemma3n_vision": {"model_args": {"channel_multiplier": 0.125}, "hidden_size": 2048},
    "pe_video": {"video_config": {"vision_config": {"model_args": _TIMM_VIT}}},  # a ViT-L/14 by default
    "pe_video_encoder": {"vision_config": {"model_args": _TIMM_VIT}},
    "pe_audio_video": {"video_config": {"vision_config": {"model_args": _TIMM_VIT}}},
    "pe_audio_video_encoder": {"video_config": {"vision_config": {"model_args": _TIMM_VIT}}},
    # its default tower (resnet50, no model_args) does not build: the projector reads model_args["embed_dim"]
    "perception_lm": {"vision_config": {"architecture": "vit_pe_core_large_patch14_336", "model_args": _TIMM_VIT}},
    "timm_backbone": {"backbone": "resnet10t"},  # none by default
    # EdgeTAM's neck reads a RepViT's four stages (48..384 channels); the default config names resnet50
    "edgetam": {"vision_config": {"backbone_config": {"architecture": "repvit_m0_9"}}},
    "edgetam_vision_model": {"backbone_config": {"architecture": "repvit_m0_9"}},
    # a Swin-T backbone (28M) read at three stages whose widths the encoder takes as encoder_in_channels
    "omdet-turbo": {"backbone_config": {"backbone": "resnet18", "out_indices": [2, 3, 4]},
                    "encoder_in_channels": [128, 256, 512]},
    # its rotary embedding rotates head_dim x partial_rotary_factor (4) dims into a hidden_size / 2 table: 8 heads
    # (the default's) keep the two in step; its __post_init__ sets the key/value heads to the heads
    "efficientloftr": {"num_attention_heads": 8, "num_key_value_heads": 8},
    # no feature level by default (projector_scale_factors=()): its encoder concatenates an empty list; the LW-DETR
    # checkpoints read one level at scale 1
    "lw_detr": {"projector_scale_factors": [1.0]},
    # a detector's topk keeps 300 of the 336 anchors of a 128-pixel image: neighbouring scores lie ~1e-6 apart and
    # each runtime's rounding orders them its own way (D-FINE's ONNX row read 1.2 on last_hidden_state in the matrix,
    # 7e-6 in a plain process); the 8 queries the second try gives RT-DETR lie 1.2e-4 (DEIMv2) to 5e-3 apart
    **dict.fromkeys(("d_fine", "deimv2", "pp_doclayout_v3", "pp_doclayout_v4"), {"num_queries": 8}),
    # its head concatenates one feature map per bridge stage (6 x 128 channels), the default backbone reads stage6
    # only; the checkpoints read all six
    "uvdoc": {"backbone_config": {"out_indices": [1, 2, 3, 4, 5, 6],
                                  "out_features": ["stage1", "stage2", "stage3", "stage4", "stage5", "stage6"]}},
    # their input projections end in GroupNorm(32, d_model), 32 hard-coded: at the shrunk width (64) a group is 2
    # channels of a 1 x 1 map (the last level of a 32-pixel image), whose normalisation turns the runtimes' 1e-5
    # convolution rounding into 2e-4..6e-4 (ONNX Runtime, ExecuTorch); 4 channels a group (the real ones have 8)
    **dict.fromkeys(("deformable_detr", "grounding-dino", "mm-grounding-dino"), {"d_model": 2 * HIDDEN}),
    # its init_std (1.0, the std of every weight) makes activations of ~2500 by the second layer, where fp32 rounding
    # alone is 1e-4 (ONNX Runtime's logits 3.8e-4 from eager's); a trained checkpoint's weights are not that large
    "cpmant": {"init_std": 0.1},
}

# model_type -> kwargs of the family's own image processor (built without files, its defaults otherwise) sized to the
# tiny tower, for the towers whose inputs only that processor lays out (Molmo 2's crops, their pooling indices and
# grids): a 27 x 27-patch crop at the tiny patch size (its position table keeps the real 729 positions), one crop
IMAGE_PROCESSOR_KWARGS: dict[str, dict[str, Any]] = {
    "molmo2": {"patch_size": 8, "size": {"height": 27 * 8, "width": 27 * 8}, "max_crops": 1},
}

# model_type -> why the generate stage compares one row, not a batch of 2: eager's batched generate is wrong upstream
# (the export's batch matches each row generated alone, where the family's test checks it)
GENERATE_ONE_ROW: dict[str, str] = {
    "rwkv": "transformers' RWKV one-token step mixes every row's state into every row (modeling_rwkv.py "
            "extract_key_value / RwkvFeedForward.forward; workaround rwkv-batched-step-shift)",
}
