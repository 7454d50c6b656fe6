"""The support matrix: discovery from transformers' auto mappings, config shrinking, one process per case with a
timeout, and the CSV / Markdown / PNG reports (numbers computed by the worker against eager PyTorch)."""

from __future__ import annotations

import csv

import pytest

from hfexport.cli import main
from hfexport.tools.matrix import Case, discover, run_matrix
from hfexport.tools.matrix.inputs import sample_inputs
from hfexport.tools.matrix.report import coverage, write_markdown
from hfexport.tools.matrix.shrink import build_model, tiny_config
from hfexport.tools.matrix.worker import UNAVAILABLE, no_inputs, run_case

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def archs():
    return {a.model_type: a for a in discover()}


@pytest.mark.parametrize("model_type,class_name,task,generative", [
    ("llama", "LlamaForCausalLM", "text-generation", True),
    ("mamba", "MambaForCausalLM", "text-generation", True),
    ("bert", "BertForMaskedLM", "fill-mask", False),
    ("t5", "T5ForConditionalGeneration", "text2text-generation", True),
    ("vit", "ViTForImageClassification", "image-classification", False),
    ("whisper", "WhisperForConditionalGeneration", "automatic-speech-recognition", True),
    ("qwen2_vl", "Qwen2VLForConditionalGeneration", "image-text-to-text", True),
    ("clip", "CLIPForImageClassification", "image-classification", False),
    ("dinov3_vit", "DINOv3ViTModel", "feature-extraction", False),
])
def test_discovery_picks_the_class_of_the_most_demanding_task(archs, model_type, class_name, task, generative):
    arch = archs[model_type]
    assert (arch.class_name, arch.task, arch.generative) == (class_name, task, generative)


def test_discovery_covers_hundreds_of_architectures_and_filters_by_substring_or_exact_name(archs):
    assert len(archs) > 400
    assert [a.model_type for a in discover(["=llama"])] == ["llama"]
    fuzzy = {a.model_type for a in discover(["llama"])}
    assert {"llama", "llama4", "diffllama"} <= fuzzy and "mistral" not in fuzzy


def test_an_override_is_merged_into_a_sub_config_at_any_depth():
    # Perception Encoder video: the timm ViT's width arguments two configs down; the rest of that config stays
    config = tiny_config("pe_video")
    vision = config.video_config.vision_config
    assert vision.model_args == {"embed_dim": 64, "depth": 2, "num_heads": 4, "dynamic_img_size": True,
                                 "dynamic_img_pad": True}
    default = type(config)().video_config.vision_config
    assert vision.architecture == default.architecture == "vit_pe_core_large_patch14_336"


def test_shrunk_configs_are_tiny_and_renumber_special_tokens():
    llama = tiny_config("llama")
    assert (llama.hidden_size, llama.num_hidden_layers, llama.num_attention_heads, llama.vocab_size) == (64, 2, 4, 256)
    gpt2 = tiny_config("gpt2")  # default eos/bos 50256 lie outside a 256-token vocabulary
    assert gpt2.n_embd == 64 and gpt2.n_layer == 2 and gpt2.eos_token_id < 256 and gpt2.bos_token_id < 256
    whisper = tiny_config("whisper")
    sizes = (whisper.d_model, whisper.encoder_layers, whisper.num_mel_bins, whisper.max_source_positions)
    assert sizes == (64, 2, 8, 16)
    llava_next = tiny_config("llava_next")  # sub-configs shrink too; the image placeholder id moves into the vocab
    assert llava_next.text_config.hidden_size == 64 and llava_next.text_config.num_hidden_layers == 2
    assert llava_next.vision_config.hidden_size == 64 and llava_next.vision_config.image_size == 32
    assert 248 <= llava_next.image_token_id < 256


def test_feed_forward_sizes_under_other_names_shrink_too():
    """DBRX's ffn_config.ffn_hidden_size (3584), XLNet's d_inner (4096), CPM-Ant's dim_ff (10240), Muse Spark's
    moe_hidden_size (4096) stayed at their defaults: DBRX's per-token expert weights planned 10.5 GiB on ExecuTorch
    (batch 8 x 512 positions), Muse Spark's 12 GiB, and CPM-Ant's 10240-wide sums drifted 3e-4 on ONNX."""
    assert tiny_config("dbrx").ffn_config.ffn_hidden_size == 128
    assert tiny_config("xlnet").d_inner == 128 and tiny_config("cpmant").dim_ff == 128
    assert tiny_config("muse_spark").text_config.moe_hidden_size == 32


def test_a_hybrid_stack_keeps_an_attention_layer_and_latent_attention_and_mrope_shrink_consistently():
    import torch

    # the first 2 of Qwen3-Next's layers are linear attention; Jamba attends every 8th layer from the 5th
    assert tiny_config("qwen3_next").layer_types == ["linear_attention", "full_attention"]
    assert tiny_config("lfm3").layer_types == ["conv", "full_attention"]
    nemotron = tiny_config("nemotron_h")  # Mamba then MoE: the MoE layer stays, an attention layer is added
    assert (nemotron.layers_block_type, nemotron.num_hidden_layers) == (["linear_attention", "moe", "full_attention"], 3)
    jamba = tiny_config("jamba")
    assert (jamba.attn_layer_period, jamba.attn_layer_offset) == (2, 1)
    assert tiny_config("gemma3_text").layer_types == ["sliding_attention"] * 2  # an attention kind already: cut only
    v3 = tiny_config("deepseek_v3")  # rope over qk_rope_head_dim; keys expanded to every head
    assert v3.head_dim == v3.qk_rope_head_dim == 8 and v3.num_key_value_heads == v3.num_attention_heads == 4
    glm = tiny_config("glm4v_moe").text_config  # half of 16 * 0.5 rotary dims
    assert sum(glm.rope_parameters["mrope_section"]) == 4
    for text in ("qwen2_5_vl_text", "hunyuan_vl_text"):  # no section in the config: the code's full-size default
        assert sum(tiny_config(text).rope_parameters["mrope_section"]) == 8
    model = build_model("deepseek_v3", "DeepseekV3ForCausalLM")  # eager generate failed on the shapes before
    prompt = sample_inputs(model, "deepseek_v3", batch=2, seq=5, for_generation=True)
    with torch.no_grad():
        assert model.generate(**prompt, max_new_tokens=2, do_sample=False).shape == (2, 7)


def test_a_backbone_the_plain_rules_cut_below_its_out_indices_gets_a_second_try_that_keeps_them():
    with pytest.raises(ValueError, match="out_features must be a subset of stage_names"):
        tiny_config("grounding-dino")  # Swin backbone read at stages 2-4, cut to 2 stages by the plain rules
    backbone = tiny_config("grounding-dino", fit=True).backbone_config
    assert (backbone.num_layers, backbone.out_features) == (4, ["stage2", "stage3", "stage4"])
    assert backbone.num_heads == [4, 4, 4, 4] and backbone.embed_dim == 64  # every stage width divides by 4
    assert tiny_config("llama", fit=True).to_dict() == tiny_config("llama").to_dict()


def test_a_model_built_on_the_second_try_runs_eagerly_and_a_width_rule_reaches_xlm():
    import torch

    swin = build_model("swinv2", "Swinv2ForImageClassification")  # plain rules: 64 wide, heads 3/6: no build
    assert swin.config.num_heads == [4, 4, 4, 4]
    with torch.no_grad():
        assert swin(**sample_inputs(swin, "swinv2")).logits.shape == (2, 2)
    xlm = build_model("xlm", "XLMWithLMHeadModel")  # its width is emb_dim (2048 by default)
    assert xlm.config.emb_dim == 64 and sum(p.numel() for p in xlm.parameters()) < 1_000_000


def test_the_second_try_caps_size_fields_by_name_and_fills_sizes_the_defaults_leave_unset():
    import torch

    plain, fit = tiny_config("florence2").vision_config, tiny_config("florence2", fit=True).vision_config
    assert plain.embed_dim == [128, 256, 512, 1024] and fit.embed_dim == [64, 64, 64, 64]
    dac = tiny_config("dac", fit=True)  # a codec's decoder width (1536) and conv groups (Mimi: 512) are capped
    assert dac.decoder_hidden_size == 64 and tiny_config("mimi", fit=True).upsample_groups == 64
    align = build_model("align", "AlignModel")  # EfficientNet-B7's width/depth multipliers: 62M parameters at 1.0
    assert align.config.vision_config.width_coefficient == 1.0
    assert sum(p.numel() for p in align.parameters()) < 10_000_000
    with torch.no_grad():
        align(**sample_inputs(align, "align"))
    assert tiny_config("ministral").head_dim is None  # None by default: a checkpoint fills it in
    ministral = build_model("ministral", "MinistralForCausalLM")
    assert ministral.config.head_dim == 16
    with torch.no_grad():
        assert ministral(**sample_inputs(ministral, "ministral")).logits.shape == (2, 6, 256)


def test_a_model_that_builds_but_fails_eagerly_is_retried_with_the_second_try_rules():
    import torch

    from hfexport.tools.matrix.worker import _eager

    def run(m):
        with torch.no_grad():
            return m(**sample_inputs(m, "sam3_lite_text"))

    import transformers

    from hfexport.tools.matrix.shrink import _build

    config = tiny_config("sam3_lite_text")
    config.vision_config.fpn_hidden_size = 256  # a size field the plain rules once missed: builds, then disagrees
    plain = _build(transformers.Sam3LiteTextModel, config)
    with pytest.raises(RuntimeError, match="normalized_shape"):
        run(plain)
    model, _ = _eager(plain, "sam3_lite_text", "Sam3LiteTextModel", run)
    assert model is not plain
    assert build_model("llama", "LlamaForCausalLM", fit=True) is None  # same config: nothing to retry
    detector = tiny_config("rt_detr", fit=True)  # top-k of 300 queries over the 21 tokens of a 32-pixel image
    assert detector.num_queries == 8 and detector.backbone_config.hidden_sizes == [64, 64, 64, 64]


def _runs_on_inputs_of_shapes(model_type, class_name, shapes):
    """The tiny model of ``model_type`` gets sample inputs of ``shapes`` and runs eagerly on them."""
    import torch

    model = build_model(model_type, class_name)
    inputs = sample_inputs(model, model_type)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == shapes
    with torch.no_grad():
        model(**inputs)


@pytest.mark.parametrize("model_type,class_name,shapes", [
    # a Qwen-VL vision tower: flattened patches of two 4 x 4-patch images (merge 2) and their grid rows
    ("qwen2_5_vl_vision", "Qwen2_5_VisionTransformerPretrainedModel", {"hidden_states": (32, 384), "grid_thw": (2, 3)}),
    ("videomae", "VideoMAEModel", {"pixel_values": (2, 16, 3, 32, 32)}),  # a video: [B, frames, C, H, W]
    ("mimi_encoder", "MimiEncoderModel", {"input_values": (2, 1, 1600)}),  # mono audio [B, 1, samples]
    ("glmasr_encoder", "GlmAsrEncoder", {"input_features": (2, 8, 32)}),  # [B, mel, frames], not [B, frames, mel]
])
def test_inputs_whose_layout_the_config_does_not_say_are_found_by_running_the_model(model_type, class_name, shapes):
    _runs_on_inputs_of_shapes(model_type, class_name, shapes)


@pytest.mark.parametrize("model_type,class_name,shapes", [
    # second try: SAM's derived image_embedding_size recomputed, 2 x num_pos_feats = the decoder's 64 channels
    ("sam", "SamModel", {"pixel_values": (2, 3, 32, 32)}),
    # the decoder class of a composite model type gets its sub-config; ids one row per codebook (4)
    ("musicgen", "MusicgenForCausalLM", {"input_ids": (8, 6), "attention_mask": (2, 6)}),
    # a NaFlex tower: 4 x 4 patches of 8 x 8 pixels, their mask and the grid per row
    ("siglip2_vision_model", "Siglip2VisionModel",
     {"pixel_values": (2, 16, 192), "pixel_attention_mask": (2, 16), "spatial_shapes": (2, 2)}),
    # hidden-state inputs: the Q-Former's query embeddings and the image features it cross-attends to
    ("blip_2_qformer", "Blip2QFormerModel",
     {"input_ids": (2, 6), "attention_mask": (2, 6), "query_embeds": (2, 6, 64), "encoder_hidden_states": (2, 6, 64)}),
    # main_input_name input_values, forward(hidden_states): mono audio of 16 frames at the 3200-sample stride
    ("vibevoice_acoustic_tokenizer_encoder", "VibeVoiceAcousticTokenizerEncoderModel",
     {"hidden_states": (2, 1, 51200)}),
    # a heterogeneous config (per-layer head_dim) read without getattr; second try: ZAYA routes to 1 expert only
    ("gemma4_text", "Gemma4ForCausalLM", {"input_ids": (2, 6), "attention_mask": (2, 6)}),
    ("zaya", "ZayaForCausalLM", {"input_ids": (2, 6), "attention_mask": (2, 6)}),
    ("modernvbert", "ModernVBertForMaskedLM",  # an encoder over text with image tokens: an image (1 token) a row
     {"input_ids": (2, 7), "attention_mask": (2, 7), "pixel_values": (2, 1, 3, 32, 32)}),
    # an image's size beside its pixels (Pixtral's tower): 16 patches of 8 pixels, merged 2 x 2 -> 4 tokens
    ("mistral3", "Mistral3ForConditionalGeneration",
     {"input_ids": (2, 10), "attention_mask": (2, 10), "pixel_values": (2, 3, 32, 32), "image_sizes": (2, 2)}),
    # LLaVA-NeXT's crops: the grid pinpoints scaled with the tower (336 -> 32), so a 32 x 32 image is the base
    # crop plus a 1 x 2 grid (3 crops): 16 base tokens + the grid unpadded back to 4 x 4 + 4 image_newline = 36
    ("llava_next", "LlavaNextForConditionalGeneration",
     {"input_ids": (2, 42), "attention_mask": (2, 42), "pixel_values": (2, 3, 3, 32, 32), "image_sizes": (2, 2)}),
    # default configs whose model reads a field they do not set (DBRX's rope_theta and clip_qkv, Moonshine-
    # Streaming's num_key_value_heads), and VipLLaVA's five feature layers of a 24-layer tower
    ("dbrx", "DbrxForCausalLM", {"input_ids": (2, 6), "attention_mask": (2, 6)}),
    ("moonshine_streaming", "MoonshineStreamingForConditionalGeneration",
     {"input_values": (2, 1600), "decoder_input_ids": (2, 3)}),
    ("vipllava", "VipLlavaForConditionalGeneration",
     {"input_ids": (2, 22), "attention_mask": (2, 22), "pixel_values": (2, 3, 32, 32)}),
    # RoPE per layer type, left empty by its defaults (CohereCompass); layer types left unset (LFM2-MoE); the Omni
    # thinkers' vision start id and M-RoPE sections
    ("cohere_compass_text", "CohereCompassForCausalLM", {"input_ids": (2, 6), "attention_mask": (2, 6)}),
    ("lfm2_moe", "Lfm2MoeForCausalLM", {"input_ids": (2, 6), "attention_mask": (2, 6)}),
    ("qwen2_5_omni_thinker", "Qwen2_5OmniThinkerForConditionalGeneration",
     {"input_ids": (2, 10), "attention_mask": (2, 10), "pixel_values": (32, 384), "image_grid_thw": (2, 3)}),
    ("qwen3_omni_moe_thinker", "Qwen3OmniMoeThinkerForConditionalGeneration",
     {"input_ids": (2, 10), "attention_mask": (2, 10), "pixel_values": (32, 384), "image_grid_thw": (2, 3)}),
    # fields their defaults leave unset and their models index (MLP types per layer, a deep-stack layer map), a
    # dropout rate the standalone encoder's text config only gets from the encoder-decoder config
    ("deepseek_ocr2", "DeepseekOcr2ForConditionalGeneration",
     {"input_ids": (2, 151), "attention_mask": (2, 151), "pixel_values": (2, 3, 32, 32)}),
    ("granite4_vision", "Granite4VisionForConditionalGeneration", {"input_ids": (2, 6), "attention_mask": (2, 6)}),
    ("t5gemma2_encoder", "T5Gemma2Encoder",
     {"input_ids": (2, 12), "attention_mask": (2, 12), "pixel_values": (2, 3, 32, 32)}),
    # a VQ image vocabulary their defaults leave unset (Chameleon: an image through its VQ tokens)
    ("chameleon", "ChameleonForConditionalGeneration",
     {"input_ids": (2, 10), "attention_mask": (2, 10), "pixel_values": (2, 3, 32, 32)}),
    ("emu3", "Emu3ForConditionalGeneration", {"input_ids": (2, 6), "attention_mask": (2, 6)}),
    # codecs that take a waveform and its semantic model's features together, a frame a hop (X-Codec 2: 16
    # frames of 320 samples); an adaptor whose width its validator ties to the text model's
    # (with ones over the frames for their optional input_features_mask)
    ("xcodec2", "Xcodec2Model",
     {"input_values": (2, 1, 5120), "input_features": (2, 16, 160), "input_features_mask": (2, 16)}),
    ("neucodec", "NeuCodecModel",
     {"input_values": (2, 1, 1600), "input_features": (2, 32, 160), "input_features_mask": (2, 32)}),
    ("fun_asr_nano", "FunAsrNanoForConditionalGeneration", {"input_ids": (2, 38), "attention_mask": (2, 38),
                                                            "input_features": (2, 32, 56),
                                                            "input_features_mask": (2, 32)}),
    # an optional features mask its encoder sums (None by default): ones over the frames
    ("audioflamingo3_encoder", "AudioFlamingo3Encoder", {"input_features": (2, 8, 32), "input_features_mask": (2, 32)}),
    # a generic main input `inputs`: the encoder's own (a speech encoder-decoder's waveform), else token ids
    ("speech-encoder-decoder", "SpeechEncoderDecoderModel", {"input_values": (2, 1600), "decoder_input_ids": (2, 3)}),
    ("perceiver", "PerceiverForMaskedLM", {"input_ids": (2, 6), "attention_mask": (2, 6)}),
    # inputs named by the forward and sized by the config (.named_inputs): a trajectory at state_dim / act_dim,
    # flattened patches with their row and column, region features and boxes, an in-context image pair
    ("decision_transformer", "DecisionTransformerModel",
     {"states": (2, 4, 17), "actions": (2, 4, 4), "rewards": (2, 4, 1), "returns_to_go": (2, 4, 1),
      "timesteps": (2, 4), "attention_mask": (2, 4)}),
    ("pix2struct", "Pix2StructForConditionalGeneration",
     {"flattened_patches": (2, 16, 770), "attention_mask": (2, 16), "decoder_input_ids": (2, 3)}),
    ("lxmert", "LxmertModel",
     {"input_ids": (2, 6), "attention_mask": (2, 6), "visual_feats": (2, 4, 2048), "visual_pos": (2, 4, 4)}),
    ("seggpt", "SegGptModel",
     {"pixel_values": (2, 3, 16, 32), "prompt_pixel_values": (2, 3, 16, 32), "prompt_masks": (2, 3, 16, 32)}),
    ("idefics", "IdeficsForVisionText2Text",
     {"input_ids": (2, 6), "attention_mask": (2, 6), "pixel_values": (2, 1, 3, 32, 32), "image_attention_mask": (2, 6, 1)}),
    ("kosmos-2", "Kosmos2ForConditionalGeneration",
     {"pixel_values": (2, 3, 32, 32), "input_ids": (2, 68), "attention_mask": (2, 68),
      "image_embeds_position_mask": (2, 68)}),
    # Kosmos-2.5: its image as Pix2Struct's flattened patches, placed as Kosmos-2's (8 latent positions, overridden
    # from 2048)
    ("kosmos-2.5", "Kosmos2_5ForConditionalGeneration",
     {"input_ids": (2, 12), "attention_mask": (2, 12), "flattened_patches": (2, 16, 770),
      "image_embeds_position_mask": (2, 12)}),
    # a boolean padding mask (Gemma 3n's audio tower: True at padded frames), over the frames, not the 128 bins
    ("gemma3n_audio", "Gemma3nAudioEncoder", {"audio_mel": (2, 32, 128), "audio_mel_mask": (2, 32)}),
    # a text-and-audio dual encoder gets a spectrogram too, as one channel [B, 1, frames, mel] (CLAP's; its
    # hierarchical tower's first width halved per stage into its hidden size); whole windows of 2 * n_window frames
    ("clap", "ClapModel", {"input_ids": (2, 6), "attention_mask": (2, 6), "input_features": (2, 1, 32, 8)}),
    ("qwen3_asr_encoder", "Qwen3ASREncoder", {"input_features": (2, 8, 100), "input_features_mask": (2, 100)}),
    # SAM 2's Hiera keeps its first stage's width (embed_dim_per_stage[0]) as its hidden size
    ("sam2_vision_model", "Sam2VisionModel", {"pixel_values": (2, 3, 32, 32)}),
    # timm towers (timm now installed; overrides pick a small variant, or timm's width arguments, and the widths
    # read off it): EdgeTAM's RepViT neck, Gemma 3n's MobileNetV5 at 1/8 of its channels, a TimmBackbone, FastVLM's
    # FastViT with its image placeholders
    ("edgetam_vision_model", "EdgeTamVisionModel", {"pixel_values": (2, 3, 32, 32)}),
    ("gemma3n_vision", "TimmWrapperModel", {"pixel_values": (2, 3, 32, 32)}),
    ("timm_backbone", "TimmBackbone", {"pixel_values": (2, 3, 32, 32)}),
    ("fast_vlm", "FastVlmForConditionalGeneration", {"input_ids": (2, 7), "attention_mask": (2, 7),
                                                     "pixel_values": (2, 3, 32, 32)}),
    # timm ViTs that resample their position embedding and pad to whole 14-pixel patches: Perception LM's tiles
    # (3 x 3 patches: 9 image tokens), PE Video's frames (a text-first class that requires the video too)
    ("perception_lm", "PerceptionLMForConditionalGeneration", {"input_ids": (2, 15), "attention_mask": (2, 15),
                                                               "pixel_values": (2, 1, 3, 32, 32)}),
    ("pe_video", "PeVideoModel", {"input_ids": (2, 6), "attention_mask": (2, 6),
                                  "pixel_values_videos": (2, 2, 3, 32, 32)}),
    # per-layer key/value head counts derived from 16 heads at the defaults, in the tiny model's 4 heads
    ("sapiens2", "Sapiens2Model", {"pixel_values": (2, 3, 32, 32)}),
    # no audio token: 8 feature frames per text position (stride 2, then 4 frames a token)
    ("voxtral_realtime", "VoxtralRealtimeForConditionalGeneration",
     {"input_ids": (2, 6), "attention_mask": (2, 6), "input_features": (2, 8, 48)}),
    # default configs that do not run, fixed by an override each: EfficientLoFTR's rotary table (8 heads) and image
    # pairs, LW-DETR's one feature level, UVDoc's six bridge maps (64 pixels: its reflect padding), X-Codec's
    # acoustic + semantic codebook width, Dia's cross-attention width (and its [B, T, channels] decoder ids), CLVP's
    # rotary head width (and its conditioning clip at the decoder's 80 mel bins), FastSpeech 2's vocoder input
    ("efficientloftr", "EfficientLoFTRModel", {"pixel_values": (2, 2, 3, 32, 32)}),
    ("lw_detr", "LwDetrModel", {"pixel_values": (2, 3, 32, 32)}),
    ("uvdoc", "UVDocModel", {"pixel_values": (2, 3, 64, 64)}),
    ("xcodec", "XcodecModel", {"input_values": (2, 1, 1600)}),
    ("dia", "DiaForConditionalGeneration", {"input_ids": (2, 6), "attention_mask": (2, 6),
                                            "decoder_input_ids": (2, 3, 9)}),
    ("clvp", "ClvpModelForConditionalGeneration", {"input_ids": (2, 6), "attention_mask": (2, 6),
                                                   "input_features": (2, 80, 32)}),
    ("fastspeech2_conformer_with_hifigan", "FastSpeech2ConformerWithHifiGan",
     {"input_ids": (2, 6), "attention_mask": (2, 6), "lang_ids": (2,)}),
    # an audio-video encoder that takes both streams, each optional in its signature
    ("pe_audio_video_encoder", "PeAudioVideoEncoder", {"input_values": (2, 1, 1920),
                                                       "pixel_values_videos": (2, 2, 3, 32, 32)}),
    # a text-only embedding model (no vision or audio config) gets no media; a low-frame-rate audio tower gets
    # frames of 8 mel bins x 7 stacked frames
    ("embedding_gemma2", "EmbeddingGemma2Model", {"input_ids": (2, 6), "attention_mask": (2, 6)}),
    ("fun_asr_nano_encoder", "FunAsrNanoEncoder", {"input_features": (2, 32, 56), "input_features_mask": (2, 32)}),
    # MiniCPM-V's tower: two images of 4 x 4 patches packed in one row, with their patch grids
    ("minicpm_ocr_vision", "MiniCPMOcrVisionModel", {"pixel_values": (1, 3, 8, 256), "target_sizes": (2, 2)}),
    # NeoMME's masked LM: each image's 16 patches flattened, one per row of pixel_values, 16 image tokens a row
    ("neomme", "NeoMMEForMaskedLM", {"input_ids": (2, 22), "attention_mask": (2, 22), "pixel_values": (32, 192)}),
    # a video-only Q-Former model: one frame a row and its query tokens as video placeholders
    ("instructblipvideo", "InstructBlipVideoForConditionalGeneration",
     {"pixel_values": (2, 1, 3, 32, 32), "qformer_input_ids": (2, 6), "qformer_attention_mask": (2, 6),
      "input_ids": (2, 38), "attention_mask": (2, 38)}),
])
def test_models_the_matrix_could_not_build_or_feed_before_run_eagerly(model_type, class_name, shapes):
    """Each of these was cannot-build, no-inputs or eager-fails (issue 22); ``_eager`` is the worker's own path
    (the second try of the shrinking rules when the first model does not run)."""
    import torch

    from hfexport.tools.matrix.worker import _eager

    def run(m):
        inputs = sample_inputs(m, model_type)
        with torch.no_grad():
            m(**inputs)
        return inputs

    model, inputs = _eager(build_model(model_type, class_name), model_type, class_name, run)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == shapes
    assert sum(p.numel() for p in model.parameters()) < 30_000_000


@pytest.mark.parametrize("model_type,class_name,shapes", [
    # a Qwen-VL-like image-text model: patches and grid of a 4 x 4-patch image a row (merge 2: 4 tokens), wrapped
    # in <vision_start> ... <vision_end>, and the processor's mm_token_type_ids (M-RoPE finds the image by them)
    ("qwen3_vl", "Qwen3VLForConditionalGeneration", {"input_ids": (2, 12), "attention_mask": (2, 12),
     "pixel_values": (32, 384), "image_grid_thw": (2, 3), "mm_token_type_ids": (2, 12)}),
    # an image-text model over a NaFlex tower: one image a row as patches, their mask and grid (4 tokens)
    ("lfm2_vl", "Lfm2VlForConditionalGeneration", {"input_ids": (2, 10), "attention_mask": (2, 10),
     "pixel_values": (2, 16, 192), "pixel_attention_mask": (2, 16), "spatial_shapes": (2, 2)}),
    # the grid's tower takes each image's merge size too, from the forward's image_merge_sizes (VideoLLaMA 3)
    ("video_llama_3", "VideoLlama3ForConditionalGeneration", {"input_ids": (2, 10), "attention_mask": (2, 10),
     "pixel_values": (8, 192), "image_grid_thw": (2, 3), "image_merge_sizes": (2,)}),
    # a tower whose width after its pixel shuffle feeds the projector (the shrink overrides keep them agreeing)
    ("muse_spark", "MuseSparkForConditionalGeneration", {"input_ids": (2, 10), "attention_mask": (2, 10),
     "pixel_values": (32, 384), "image_grid_thw": (2, 3)}),
    # MiniCPM-V's: both images' patches packed in one row with each image's patch grid (4 x 4, merged to 4 tokens)
    ("minicpm_ocr", "MiniCPMOcrForConditionalGeneration", {"input_ids": (2, 10), "attention_mask": (2, 10),
     "pixel_values": (1, 3, 8, 256), "target_sizes": (2, 2)}),
])
def test_image_text_models_whose_tower_takes_a_grid_or_patches_get_an_image(model_type, class_name, shapes):
    """They got text only before (generate: no-inputs, issue 22). The image must reach the logits: other pixels,
    other logits at the text after the image."""
    import torch

    model = build_model(model_type, class_name)
    inputs = sample_inputs(model, model_type)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == shapes
    token = model.config.image_token_id
    assert (inputs["input_ids"] == token).sum(dim=1).tolist() == [4, 4]
    if "mm_token_type_ids" in inputs:
        assert torch.equal(inputs["mm_token_type_ids"].bool(), inputs["input_ids"] == token)
        start, end = model.config.vision_start_token_id, model.config.vision_end_token_id
        assert inputs["input_ids"][1, :6].tolist() == [start, token, token, token, token, end]
    with torch.no_grad():
        logits = model(**inputs).logits[:, -1]
        other = model(**{**inputs, "pixel_values": inputs["pixel_values"] + 1.0}).logits[:, -1]
    assert (logits - other).abs().max() > 1e-4


@pytest.mark.parametrize("model_type, class_name, shapes, tokens", [
    # a 2 x 2-patch grid given as [height, width] rows (no time axis), pixel-shuffled to one token; its config leaves
    # the image token to the processor (the override sets it)
    ("nemotron_h_omni", "NemotronH_Omni_Reasoning_V3", {"input_ids": (2, 7), "attention_mask": (2, 7),
     "pixel_values": (8, 192), "image_grid_hw": (2, 2)}, 1),
    # crops, pooling indices and grids only Molmo 2's own image processor lays out (one 27 x 27-patch crop of 8-pixel
    # patches plus its low-resolution view: 2 x 196 pooled tokens)
    ("molmo2", "Molmo2ForConditionalGeneration", {"input_ids": (2, 400), "attention_mask": (2, 400),
     "pixel_values": (4, 729, 192), "image_token_pooling": (784, 4), "image_grids": (2, 4), "image_num_crops": (2,),
     "mm_token_type_ids": (2, 400)}, 392),
])
def test_image_text_models_whose_image_inputs_only_their_processor_names_get_an_image(model_type, class_name, shapes,
                                                                                      tokens):
    """They got text only before (generate: no-inputs, issue 22)."""
    import torch

    model = build_model(model_type, class_name)
    inputs = sample_inputs(model, model_type)
    assert {k: tuple(v.shape) for k, v in inputs.items()} == shapes
    assert (inputs["input_ids"] == model.config.image_token_id).sum(dim=1).tolist() == [tokens, tokens]
    with torch.no_grad():
        logits = model(**inputs).logits
        other = model(**{**inputs, "pixel_values": torch.randn_like(inputs["pixel_values"])}).logits
    # the image reaches the text model: a dropped one leaves the logits bit for bit (Molmo 2's tiny random adapter
    # adds features of ~1e-3 to the placeholders' embeddings: its logits move by ~5e-6)
    assert (logits - other).abs().max() > 1e-6


def test_a_shrunk_model_builds_small_deterministic_and_runs_on_its_sample_inputs():
    import torch

    model = build_model("whisper", "WhisperForConditionalGeneration")
    again = build_model("whisper", "WhisperForConditionalGeneration")
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    inputs = sample_inputs(model, "whisper")
    assert inputs["input_features"].shape == (2, 8, 32)  # Whisper needs 2 * max_source_positions frames
    assert int(inputs["decoder_input_ids"][0, 0]) == model.config.decoder_start_token_id
    with torch.no_grad():
        logits = model(**inputs).logits
    assert logits.shape[:2] == inputs["decoder_input_ids"].shape and logits.shape[-1] == 256


def test_a_bert_style_decoder_class_is_built_as_a_decoder_and_generates_through_its_export():
    """BertGenerationDecoder is causal, with a cache, only with is_decoder=True (transformers tells a standalone user
    to set it); built without it, its prefill returned no cache and every backend's generate failed."""
    from hfexport.tools.matrix.worker import run_case

    assert build_model("bert-generation", "BertGenerationDecoder").config.is_decoder is True
    assert build_model("bert", "BertForMaskedLM").config.is_decoder is False  # an encoder stays one
    row = run_case("bert-generation", "BertGenerationDecoder", "text-generation", "dynamo", "generate")
    assert row["status"] == "pass" and row["mismatched_tokens"] == 0, row


def test_image_text_models_get_one_image_and_as_many_placeholder_tokens_as_image_features():
    import torch

    model = build_model("paligemma", "PaliGemmaForConditionalGeneration")
    inputs = sample_inputs(model, "paligemma")
    assert inputs["pixel_values"].shape == (2, 3, 32, 32)
    per_row = (inputs["input_ids"] == model.config.image_token_id).sum(-1)
    assert per_row.tolist() == [16, 16]  # (32 / 8) ** 2 patches of the shrunk SigLIP tower, one token each
    assert inputs["attention_mask"].shape == inputs["input_ids"].shape == (2, 6 + 16)
    with torch.no_grad():
        assert model(**inputs).logits.shape == (2, 22, 256)


@pytest.mark.parametrize("model_type, class_name, layout, tokens", [
    # a grid counted in merged tokens, each a channels-last block of 2 x 2 patches of 8 pixels: [tokens, 16, 16, 3]
    ("inkling2", "Inkling2ForConditionalGeneration", (32, 16, 16, 3), 16),
    # two frames channels last, [B, T, H, W, C]; one 1024-wide row per image fills its 16 tokens of 64
    ("inkling_mm_model", "InklingForConditionalGeneration", (2, 2, 32, 32, 3), 16),
])
def test_image_text_models_get_the_pixel_layout_their_tower_reads(model_type, class_name, layout, tokens):
    import torch

    model = build_model(model_type, class_name)
    inputs = sample_inputs(model, model_type, for_generation=True)
    assert tuple(inputs["pixel_values"].shape) == layout
    assert (inputs["input_ids"] == model.config.image_token_id).sum(-1).tolist() == [tokens, tokens]
    with torch.no_grad():
        seen = model(**inputs).logits[:, -1]
        blank = model(**{**inputs, "pixel_values": torch.zeros_like(inputs["pixel_values"])}).logits[:, -1]
    assert (seen - blank).abs().max() > 1e-3  # the image reaches the text model's output


@pytest.mark.parametrize("model_type, class_name, tokens", [
    # 32 frames -> 16 after the stride-2 convolution -> 8 after the pooling by 2 (Audio Flamingo 3, Qwen2-Audio), 4
    # after GLM-ASR's merge of 4
    ("audioflamingo3", "AudioFlamingo3ForConditionalGeneration", 8),
    ("qwen2_audio", "Qwen2AudioForConditionalGeneration", 8),  # not the legacy prompt of one token it expands itself
    ("glmasr", "GlmAsrForConditionalGeneration", 4),
    # its mel bins named two configs down (audio_config.asr_config): 32 frames [B, frames, 8] -> 4 at its stride 8
    ("nemo_speechlm", "Nemotron3_5TranscribeForConditionalGeneration", 4),
])
def test_audio_text_models_get_one_clip_and_as_many_audio_tokens_as_audio_features(model_type, class_name, tokens):
    import torch

    model = build_model(model_type, class_name)
    inputs = sample_inputs(model, model_type, for_generation=True)
    token = getattr(model.config, "audio_token_id", None) or model.config.audio_token_index
    assert inputs["input_features"].shape[0] == 2
    assert (inputs["input_ids"] == token).sum(-1).tolist() == [tokens, tokens]
    with torch.no_grad():
        with_audio = model(**inputs).logits[:, -1]
        silent = model(**{**inputs, "input_features": torch.zeros_like(inputs["input_features"])}).logits[:, -1]
    assert (with_audio - silent).abs().max() > 1e-3  # the clip reaches the text model's output


def test_a_per_layer_list_of_head_counts_follows_the_tiny_head_counts():
    config = tiny_config("sapiens2")
    assert config.num_attention_heads == 4
    assert config.num_key_value_heads_per_layer == [4, 4]  # full attention in both kept layers, was [16, 16]


def test_a_streaming_audio_model_without_an_audio_token_gets_one_audio_embedding_per_text_position():
    import torch

    model = build_model("voxtral_realtime", "VoxtralRealtimeForConditionalGeneration")
    inputs = sample_inputs(model, "voxtral_realtime")
    with torch.no_grad():
        embeds = model.get_audio_features(input_features=inputs["input_features"]).pooler_output
        logits = model(**inputs).logits
        shifted = model(**{**inputs, "input_features": inputs["input_features"].roll(8, dims=-1)}).logits
    assert embeds.shape[:2] == inputs["input_ids"].shape  # not one embedding broadcast over the text
    assert (logits[:, 0] - shifted[:, 0]).abs().max() > 1e-3  # each position reads its own frames


def test_an_encoder_decoder_without_a_start_token_starts_from_pad_like_t5_so_eager_generate_runs():
    import torch

    model = build_model("t5", "T5ForConditionalGeneration")
    assert model.generation_config.decoder_start_token_id == model.config.pad_token_id == 0
    with torch.no_grad():
        out = model.generate(**sample_inputs(model, "t5", for_generation=True), max_new_tokens=3, do_sample=False)
    assert out.shape[0] == 2 and (out[:, 0] == 0).all()


def test_a_missing_backend_module_is_reported_as_unavailable_not_a_crash(monkeypatch):
    from hfexport import registry
    from hfexport.configs import ExportFormat

    monkeypatch.setitem(registry._BUILTIN, ExportFormat.OPENVINO, (
        "hfexport.backends.not_shipped.exporter:X", "hfexport.backends.not_shipped.runner:Y"))
    monkeypatch.setattr(registry, "_exporters", {})
    row = run_case("llama", "LlamaForCausalLM", "text-generation", "openvino", "export")
    assert (row["status"], row["reason"]) == ("unavailable", UNAVAILABLE)


def test_a_class_that_cannot_be_built_is_cannot_build_with_the_reason():
    row = run_case("llama", "LlamaForNothingAtAll", "text-generation", "dynamo", "export")
    assert row["status"] == "cannot-build" and "LlamaForNothingAtAll" in row["reason"]


def test_coverage_leaves_out_cannot_build_and_where_inputs_work_also_the_matrix_gaps():
    rows = [{"model_type": m, "class_name": "", "task": "", "backend": "dynamo", "stage": "export", "status": s,
             "max_abs_diff": None, "export_seconds": None, "reason": ""}
            for m, s in [("a", "pass"), ("b", "fail"), ("c", "cannot-build"), ("d", "eager-fails"), ("e", "pass"),
                         ("f", "no-inputs")]]
    cov = coverage(rows)[("dynamo", "export")]
    assert (cov["pass"], cov["counted"], cov["percent"], cov["eager_percent"]) == (2, 5, 40.0, 66.7)


@pytest.mark.parametrize("reason,gap", [
    ("matrix: no sample-input recipe for the main input 'states'", True),
    ("ValueError: AriaForConditionalGeneration(**inputs) did not call ['image_encoder']; check that the inputs hold "
     "what those parts take (inputs: ['attention_mask', 'input_ids', 'use_cache']) (capture/multimodal.py:310)", True),
    ("ValueError: LlavaForConditionalGeneration(**inputs) did not call ['image_encoder']; check that the inputs hold "
     "what those parts take (inputs: ['input_ids', 'pixel_values']) (capture/multimodal.py:310)", False),
    ("ExportError: export of component 'model' failed: GuardOnDataDependentSymNode", False),
])
def test_only_the_matrix_own_input_gaps_are_no_inputs(reason, gap):
    assert no_inputs(reason) is gap


def test_a_text_only_capture_wrapped_by_the_export_is_still_the_matrix_gap():
    # the export wraps the capture's ValueError, and the row's reason cuts its message before "(inputs: [...])"
    from hfexport.errors import ExportError

    def wrapped(inputs):
        try:
            raise ValueError(f"Mistral3ForConditionalGeneration(**inputs) did not call ['image_encoder', "
                             f"'multi_modal_projector']; check that the inputs hold what those parts take "
                             f"(inputs: {inputs})")
        except ValueError as e:
            try:
                raise ExportError("export of component 'generate' (Mistral3ForConditionalGeneration) during "
                                  "capture failed") from e
            except ExportError as outer:
                return outer

    assert no_inputs(wrapped(['attention_mask', 'input_ids', 'past_key_values'])) is True
    assert no_inputs(wrapped(['input_ids', 'pixel_values'])) is False
    assert no_inputs(ExportError("export of component 'model' failed: GuardOnDataDependentSymNode")) is False


def test_a_case_past_its_timeout_is_killed_and_reported(archs):
    [row] = run_matrix([Case(archs["llama"], "dynamo", "generate")], timeout=1)
    assert row["status"] == "timeout" and row["reason"] == "no result within 1 s"


@pytest.fixture(scope="module")
def two_case_run(tmp_path_factory):
    """``hfexport matrix`` on tiny Llama: Dynamo export (real parity vs eager) and a backend that does not exist."""
    out = tmp_path_factory.mktemp("matrix")
    code = main(["matrix", "--backends", "dynamo", "no-such-backend", "--families", "=llama", "--stages", "export",
                 "--timeout", "240", "--jobs", "2", "--out", str(out)])
    return code, out


def test_the_cli_run_writes_csv_rows_with_real_parity_and_failure_reasons(two_case_run):
    code, out = two_case_run
    assert code == 0  # failures are data
    with (out / "support-matrix.csv").open() as f:
        rows = {r["backend"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"dynamo", "no-such-backend"}
    ok = rows["dynamo"]
    assert (ok["model_type"], ok["class_name"], ok["stage"], ok["status"]) == (
        "llama", "LlamaForCausalLM", "export", "pass")
    assert 0.0 <= float(ok["max_abs_diff"]) <= 1e-4 and float(ok["export_seconds"]) > 0
    bad = rows["no-such-backend"]
    assert bad["status"] == "fail" and bad["reason"].startswith("ConfigError") and "no-such-backend" in bad["reason"]
    assert not (out / "support-matrix.partial.csv").exists()


def test_the_cli_run_writes_markdown_with_coverage_and_a_png_heat_map(two_case_run):
    _, out = two_case_run
    md = (out / "support-matrix.md").read_text()
    assert "| dynamo | export | 1 | 1 | 0 | 100.0 % | 0 | 100.0 % |" in md
    assert "| no-such-backend | export | 0 | 1 | 0 | 0.0 % | 0 | 0.0 % |" in md
    assert "1 of the" in md and "--backends dynamo no-such-backend" in md  # says it was a partial run, and how
    png = (out / "support-matrix.png").read_bytes()
    assert png[:8] == PNG_MAGIC and len(png) > 1000


def test_markdown_says_when_a_backend_is_not_in_this_release(tmp_path):
    rows = [{"model_type": "llama", "class_name": "LlamaForCausalLM", "task": "text-generation", "backend": "openvino",
             "stage": "export", "status": "unavailable", "max_abs_diff": None, "export_seconds": None,
             "reason": UNAVAILABLE}]
    text = write_markdown(rows, tmp_path / "m.md").read_text()
    assert "| openvino | export | 0 | 1 | 0 | n/a (backend not available in this release) | 0 | n/a |" in text


def test_the_markdown_counts_reasons_of_one_kind_together_across_numbers_and_model_names(tmp_path):
    def row(model_type, status, reason):
        return {"model_type": model_type, "class_name": "", "task": "fill-mask", "backend": "dynamo",
                "stage": "export", "status": status, "max_abs_diff": None, "export_seconds": None, "reason": reason}

    rows = [row("a", "cannot-build", "ValueError: the shrunk model still has 62M parameters (> 30M)"),
            row("b", "cannot-build", "ValueError: the shrunk model still has 193M parameters (> 30M)"),
            row("c", "eager-fails", "TypeError: AlignModel.forward() got 'x' (models/align/modeling_align.py:12)"),
            row("d", "eager-fails", "TypeError: BlipModel.forward() got 'x' (models/blip/modeling_blip.py:99)"),
            row("e", "pass", "")]
    text = write_markdown(rows, tmp_path / "m.md").read_text()
    assert "- **cannot-build** (2 cases): 2 x `ValueError: the shrunk model still has NM parameters (> NM)`" in text
    assert "- **eager-fails** (2 cases): 2 x `TypeError: <Model>.forward() got 'x'`" in text


@pytest.mark.parametrize("model_type,class_name,shapes", [
    # the context plus the largest lag (4 + 7), and the decoder's prediction_length steps of future values
    ("time_series_transformer", "TimeSeriesTransformerModel", {
        "past_values": (2, 11), "past_observed_mask": (2, 11), "past_time_features": (2, 11, 0),
        "future_values": (2, 4), "future_time_features": (2, 4, 0)}),
    ("autoformer", "AutoformerModel", {  # its label window is capped to the 4-step context (10 by default)
        "past_values": (2, 11), "past_observed_mask": (2, 11), "past_time_features": (2, 11, 0),
        "future_values": (2, 4), "future_time_features": (2, 4, 0)}),
    ("patchtst", "PatchTSTModel", {"past_values": (2, 32, 1), "past_observed_mask": (2, 32, 1)}),
    ("timesfm", "TimesFmModel", {"past_values": (2, 512), "past_values_padding": (2, 512), "freq": (2, 1)}),
    # its 16384-step context capped to 512 steps (16 patches): its ONNX export ran > 10 minutes at 16384
    ("timesfm2_5", "TimesFm2_5Model", {"past_values": (2, 512), "past_values_padding": (2, 512)}),
])
def test_time_series_models_get_past_values_and_their_companions_shaped_from_the_config(model_type, class_name,
                                                                                       shapes):
    """These had no sample-input recipe ('past_values') before."""
    _runs_on_inputs_of_shapes(model_type, class_name, shapes)


def test_layout_models_get_one_ordered_box_per_token():
    """BROS and UDOP refused to run without boxes ("You have to specify bbox"); UDOP takes them normalised.
    LayoutLMv3's 4 coordinate and 2 shape embeddings (128 each by default) must add up to the hidden size (64)."""
    import torch

    assert 4 * tiny_config("layoutlmv3").coordinate_size + 2 * tiny_config("layoutlmv3").shape_size == 64
    for model_type, class_name, dtype in [("bros", "BrosModel", torch.long),
                                          ("udop", "UdopForConditionalGeneration", torch.float32),
                                          ("layoutlmv3", "LayoutLMv3Model", torch.long)]:
        model = build_model(model_type, class_name)
        inputs = sample_inputs(model, model_type)
        boxes = inputs["bbox"]
        assert boxes.shape == (*inputs["input_ids"].shape, 4) and boxes.dtype == dtype
        assert (boxes[..., 0] <= boxes[..., 2]).all() and (boxes[..., 1] <= boxes[..., 3]).all()
        assert 0 <= float(boxes.min()) and float(boxes.max()) <= (1000 if dtype == torch.long else 1)
        with torch.no_grad():
            model(**inputs)


def test_images_are_sized_for_a_windowed_tower_and_larger_sides_are_tried_where_32_pixels_downsample_to_nothing():
    """Donut-Swin (window 7, 4-pixel patches, 2 stages) needs 56 pixels for a whole window at its last stage: at 32
    its relative position bias (49 entries) met 16-token windows. LeViT's 16x stem and its 4 x 4 attention-bias grid
    (32 / 8) need a 64-pixel image."""
    import torch

    from hfexport.tools.matrix.media import window_side

    for model_type, class_name, side in [("donut-swin", "DonutSwinForImageClassification", 56),
                                         ("levit", "LevitForImageClassification", 64)]:
        model = build_model(model_type, class_name)
        inputs = sample_inputs(model, model_type)
        assert inputs["pixel_values"].shape == (2, 3, side, side)
        with torch.no_grad():
            model(**inputs)
    assert window_side(tiny_config("swin")) == 4 * 7 * 2 and window_side(tiny_config("qwen2_5_vl").vision_config) == 0


def test_an_image_first_class_gets_the_text_it_needs_with_its_query_token_placeholders():
    """BLIP's captioner ran on pixels alone into a None text; BLIP-2 and InstructBLIP required input_ids (and
    InstructBLIP its Q-Former's qformer_input_ids); BLIP-2's text holds one placeholder per query token, whose id is
    None by default ('bool' object has no attribute 'unsqueeze'): the second try's rules give it one. So does
    InstructBLIP's, whose get_image_features also reads the Q-Former's prompt."""
    import torch

    blip = build_model("blip", "BlipForConditionalGeneration")
    inputs = sample_inputs(blip, "blip")
    assert set(inputs) == {"pixel_values", "input_ids", "attention_mask"}
    with torch.no_grad():
        blip(**inputs)
    for model_type, class_name in [("blip-2", "Blip2ForConditionalGeneration"),
                                   ("instructblip", "InstructBlipForConditionalGeneration")]:
        assert tiny_config(model_type).image_token_index is None
        model = build_model(model_type, class_name, fit=True)
        inputs = sample_inputs(model, model_type)
        per_row = (inputs["input_ids"] == model.config.image_token_index).sum(-1).tolist()
        # (InstructBLIP's get_image_features takes the Q-Former's prompt too: given the one built beside the text)
        assert per_row == [model.config.num_query_tokens] * 2
        if model_type == "instructblip":
            assert inputs["qformer_input_ids"].shape == (2, 6)
        with torch.no_grad():
            model(**inputs)


def test_a_sliding_window_the_defaults_leave_unset_gets_a_tiny_one_on_the_second_try():
    """Step-3.7's masks ask for a sliding window that its config leaves None ("Could not find a `sliding_window`")."""
    import torch

    from hfexport.tools.matrix.worker import _eager

    def run(m):
        with torch.no_grad():
            return m(**sample_inputs(m, "step3p7"))

    plain = build_model("step3p7", "Step3p7ForConditionalGeneration")
    assert plain.config.text_config.sliding_window is None
    with pytest.raises(ValueError, match="sliding_window"):
        run(plain)
    model, _ = _eager(plain, "step3p7", "Step3p7ForConditionalGeneration", run)
    assert model.config.text_config.sliding_window == 8


def test_features_whose_size_the_config_does_not_name_get_128_log_mel_bins():
    """Gemma 4's audio tower names no feature size (its feature extractor's 128 bins): no recipe before."""
    import torch

    model = build_model("gemma4_audio", "Gemma4AudioModel")
    inputs = sample_inputs(model, "gemma4_audio")
    assert inputs["input_features"].shape[0] == 2 and 128 in inputs["input_features"].shape[1:]
    with torch.no_grad():
        model(**inputs)


def test_a_router_the_init_leaves_at_zero_gets_random_weights():
    """AFMoE's init zeroes its router: every expert then ties, and ONNX Runtime and OpenVINO break the tie of
    ``topk`` otherwise than torch (its rows read a 0.18 mismatch that no trained router has)."""
    import torch
    from transformers import AfmoeForCausalLM

    model = build_model("afmoe", "AfmoeForCausalLM")
    plain = AfmoeForCausalLM._from_config(model.config, dtype=torch.float32)  # the class's own init
    routers = [n for n, p in plain.named_parameters() if "router" in n and p.dim() == 2]
    assert routers and not any(dict(plain.named_parameters())[n].any() for n in routers)
    again = build_model("afmoe", "AfmoeForCausalLM")
    for name in routers:
        weight = dict(model.named_parameters())[name]
        assert weight.abs().max() > 0 and torch.equal(weight, dict(again.named_parameters())[name])  # seeded


def test_batch_norms_the_init_draws_near_zero_get_scale_one_so_detection_scores_do_not_all_tie():
    """RT-DETR's init draws its batch norms' weights from normal(0, 0.02): the encoder's output fell to ~1e-9 and every
    detection score was the same number, so ``topk`` chose the queries by tie-breaking (ONNX, OpenVINO and ExecuTorch
    rows read a 4.4 mismatch while every value before the ``topk`` matched)."""
    import torch
    from transformers import RTDetrModel

    model = build_model("rt_detr", "RTDetrModel")
    plain = RTDetrModel._from_config(model.config, dtype=torch.float32).eval()  # the class's own init
    norms = [m for m in plain.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms and max(float(m.weight.abs().mean()) for m in norms) < 0.1
    inputs = sample_inputs(model, "rt_detr")
    with torch.no_grad():
        tied = plain(**inputs).enc_outputs_class.amax(-1)
        scores = model(**inputs).enc_outputs_class.amax(-1)
    assert float(tied.std()) < 1e-5  # every anchor scores the same: the order topk gives is arbitrary
    assert float(scores.std()) > 1e-3 and len(torch.unique(scores)) == scores.numel()


def test_a_family_that_sizes_values_by_heads_keeps_one_key_value_head_per_head_where_grouping_would_break_it():
    """Nemotron-3 Diarization's audio encoder sizes its keys by num_key_value_heads and its values by
    num_attention_heads; with the rules' 2 of 4 it ran eagerly only because SDPA reads the heads off each tensor, and
    every export refused it ("Attempting to broadcast a dimension of length 8"). Llama keeps grouped-query attention."""
    import torch

    diarization = build_model("nemotron3_diarization_audio", "Nemotron3DiarizationAudioModel")
    pairs = [(m.k_proj.out_features, m.v_proj.out_features) for m in diarization.modules() if hasattr(m, "k_proj")]
    assert pairs and all(k == v for k, v in pairs)
    assert diarization.config.num_key_value_heads == diarization.config.num_attention_heads
    llama = build_model("llama", "LlamaForCausalLM")
    assert llama.config.num_key_value_heads < llama.config.num_attention_heads
    assert isinstance(llama.model.layers[0].self_attn.k_proj, torch.nn.Linear)


def test_layouts_of_two_inputs_are_also_tried_together():
    """A candidate with two tensors that each have layouts: each alone in its other layouts, then both changed at
    once (a codec whose waveform must be mono while its features are transposed), each combination once."""
    import torch

    from hfexport.tools.matrix.media import variants

    base = {"a": torch.zeros(1), "b": torch.zeros(2), "c": torch.zeros(3)}
    layouts = {"a": lambda t: iter([t, t + 1]), "b": lambda t: iter([t, t + 1, t + 2])}
    seen = [(float(v["a"][0]), float(v["b"][0])) for v in variants(base, layouts)]
    assert seen[0] == (0, 0) and set(seen) == {(a, b) for a in (0, 1) for b in (0, 1, 2)}
    assert len(seen) == len(set(seen)) == 6


def test_named_inputs_carry_what_their_models_read_from_them():
    """Pix2Struct reads each patch's row and column from its first two values, Kosmos-2 puts its image at the
    positions of image_embeds_position_mask (after the start token), Gemma 3n's audio mask is True at padding."""
    import torch

    patches = sample_inputs(build_model("pix2struct", "Pix2StructForConditionalGeneration"), "pix2struct")
    rows, cols = patches["flattened_patches"][0, :, 0], patches["flattened_patches"][0, :, 1]
    assert rows.tolist() == [r for r in range(1, 5) for _ in range(4)] and cols.tolist() == [1, 2, 3, 4] * 4

    kosmos = build_model("kosmos-2", "Kosmos2ForConditionalGeneration")
    where = sample_inputs(kosmos, "kosmos-2")["image_embeds_position_mask"]
    assert where[:, 0].eq(0).all() and int(where[0].sum()) == kosmos.config.latent_query_num

    mask = sample_inputs(build_model("gemma3n_audio", "Gemma3nAudioEncoder"), "gemma3n_audio")["audio_mel_mask"]
    assert mask.dtype == torch.bool and not mask.any()


def test_a_vocoder_gets_its_noise_as_an_input_so_eager_is_deterministic():
    """UnivNet draws its noise with randn when not given it: a program with a random op neither matches eager nor
    converts (ONNX: no function for aten.randn.generator); the matrix passes ``noise_sequence``."""
    import torch

    model = build_model("univnet", "UnivNetModel")
    inputs = sample_inputs(model, "univnet")
    features, noise = inputs["input_features"], inputs["noise_sequence"]
    assert noise.shape == (*features.shape[:2], model.config.model_in_channels)
    with torch.no_grad():
        first, second = model(**inputs).waveforms, model(**inputs).waveforms
        unseeded = model(input_features=features).waveforms
    assert torch.equal(first, second) and not torch.allclose(first, unseeded)


def test_a_generate_row_where_eager_stops_at_once_compares_new_tokens_tokens_not_one(monkeypatch):
    """A random tiny model may emit EOS as its first token (Florence-2's), and an export that stops too would pass on
    no token at all: the worker then has both sides generate NEW_TOKENS with transformers' min_new_tokens."""
    import torch

    from hfexport import ExportedModel
    from hfexport.testing.tiny import TINY_CASES
    from hfexport.tools.matrix import worker

    model = TINY_CASES["llama"].build()
    prompt = sample_inputs(model, "llama", batch=2, seq=9, for_generation=True)
    with torch.no_grad():
        first = model.generate(**prompt, max_new_tokens=1, do_sample=False)[:, -1]
    model.generation_config.eos_token_id = sorted(set(first.tolist()))
    model.generation_config.pad_token_id = 0
    with torch.no_grad():  # premise: eager now stops after its first token
        stopped = model.generate(**prompt, max_new_tokens=worker.NEW_TOKENS, do_sample=False)
    assert stopped.shape[-1] == 9 + 1 and worker.stopped_early(model, prompt, stopped)
    calls = []
    original = ExportedModel.generate

    def spy(self, **kwargs):
        out = original(self, **kwargs)
        calls.append((kwargs.get("min_new_tokens"), out.shape[-1]))
        return out

    monkeypatch.setattr(ExportedModel, "generate", spy)
    result = {"status": "fail", "reason": ""}
    worker._generate_stage(model, "llama", "dynamo", result, "LlamaForCausalLM")
    assert result["status"] == "pass" and result["mismatched_tokens"] == 0, result
    assert calls == [(worker.NEW_TOKENS, 9 + worker.NEW_TOKENS)]


@pytest.mark.parametrize("model_type, class_name", [("d_fine", "DFineModel"), ("deimv2", "Deimv2Model")])
def test_convolutions_the_init_draws_small_get_a_scale_keeping_draw_so_query_scores_do_not_tie(model_type, class_name):
    """D-FINE's and DEIMv2's init draws their convolutions from normal(0, 0.01): a dozen of them took the encoder's
    input to ~1e-12, 320 of 336 detection scores fell on 5 values, and ONNX, OpenVINO and ExecuTorch rows read a 6.9
    mismatch on init_reference_points while every score matched (topk broke the ties each its own way)."""
    import torch
    import transformers

    model = build_model(model_type, class_name)
    plain = getattr(transformers, class_name)._from_config(model.config, dtype=torch.float32).eval()
    from hfexport.tools.matrix.weights import lift_vanishing_norms

    lift_vanishing_norms(plain)  # the batch norms as the matrix builds them: the convolutions alone differ
    inputs = sample_inputs(model, model_type)
    with torch.no_grad():
        tied = plain(**inputs).enc_outputs_class.amax(-1)
        scores = model(**inputs).enc_outputs_class.amax(-1)
    assert len(torch.unique(tied[0])) < 50  # most of the 336 anchors share a handful of scores
    top = torch.topk(scores, model.config.num_queries, dim=1).values
    assert all(len(torch.unique(row)) == model.config.num_queries for row in top)  # no tie among the queries kept
    again = build_model(model_type, class_name)  # seeded: every build draws the same weights
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))


def test_a_size_named_one_config_under_a_sub_config_is_found_and_a_plain_sub_value_is_skipped():
    from transformers import PretrainedConfig

    from hfexport.tools.matrix.media import config_value

    asr = PretrainedConfig(num_mel_bins=8)
    nested = PretrainedConfig(audio_config=PretrainedConfig(asr_config=asr))
    assert config_value(nested, "num_mel_bins") == 8  # (Nemotron 3.5 Transcribe: audio_config.asr_config)
    top = PretrainedConfig(num_mel_bins=80, audio_config=PretrainedConfig(asr_config=asr))
    assert config_value(top, "num_mel_bins") == 80  # the nearer one wins
    plain = PretrainedConfig(encoder_config={"num_mel_bins": 4})  # (FastSpeech 2 Conformer: a plain value)
    assert config_value(plain, "num_mel_bins") is None


def test_crop_grid_pinpoints_scale_with_the_tower_in_the_unit_they_are_written_in():
    """LLaVA-NeXT's pinpoints are multiples of its tower's 336 pixels; Granite 4 Vision's default pinpoints are
    multiples of 336 beside a 224-pixel default tower (scaled by 32/224 they were 48 x 96: no whole crops)."""
    from hfexport.tools.matrix.shrink import tiny_config

    crops = [[32, 64], [64, 32], [64, 64], [96, 32], [32, 96]]
    assert tiny_config("granite4_vision").image_grid_pinpoints == crops
    assert tiny_config("llava_next").image_grid_pinpoints[:2] == crops[:2]


@pytest.mark.parametrize("model_type, class_name", [
    ("deformable_detr", "DeformableDetrModel"),
    pytest.param("grounding-dino", "GroundingDinoModel", marks=pytest.mark.sweep),
    pytest.param("mm-grounding-dino", "MMGroundingDinoModel", marks=pytest.mark.sweep)])
def test_a_group_norm_of_32_hard_coded_groups_keeps_four_channels_a_group(model_type, class_name, monkeypatch):
    """Deformable DETR's and Grounding DINO's input projections end in ``GroupNorm(32, d_model)``: at the rules'
    width a group was 2 channels of a 1 x 1 map, and the runtimes' 1e-5 convolution rounding came out 2e-4..6e-4
    after it (the ONNX rows' mismatches, the ExecuTorch one of Deformable DETR: parity of the export is in the
    sweep test below)."""
    import torch

    from hfexport.tools.matrix import shrink

    def groups(model):
        norms = [m for m in model.modules() if isinstance(m, torch.nn.GroupNorm) and m.num_groups == 32]
        assert norms
        return {m.num_channels // m.num_groups for m in norms}

    assert groups(build_model(model_type, class_name)) == {4}
    monkeypatch.setitem(shrink.OVERRIDES, model_type, {})
    assert groups(build_model(model_type, class_name)) == {2}  # the plain rules' width


@pytest.mark.sweep  # (the ONNX export of a ResNet-50 detector, ~25 s)
def test_deformable_detr_at_four_channels_a_group_exports_to_onnx_within_the_fp32_bound():
    row = run_case("deformable_detr", "DeformableDetrModel", "feature-extraction", "onnx", "export")
    assert row["status"] == "pass" and row["max_abs_diff"] <= 1e-4, row


def test_cpm_ant_is_drawn_at_a_trained_scale(monkeypatch):
    """CPM-Ant's config draws every weight at std 1.0 (init_std): activations of ~2500 by its second layer, where
    fp32 rounding alone is above 1e-4 (ONNX Runtime's logits were 3.8e-4 from eager's: the sweep test below); the
    matrix draws at 0.1, and its 10240-wide feed-forward (dim_ff) is shrunk like the others."""
    import torch

    from hfexport.tools.matrix import shrink

    def largest_activation(model):
        seen = []
        hooks = [m.register_forward_hook(lambda m, a, o: seen.append(float(o.abs().max())))
                 for m in model.modules() if isinstance(m, torch.nn.Linear)]
        with torch.no_grad():
            model(**sample_inputs(model, "cpmant"))
        for hook in hooks:
            hook.remove()
        return max(seen)

    model = build_model("cpmant", "CpmAntForCausalLM")
    assert model.config.dim_ff == 128 and largest_activation(model) < 100
    monkeypatch.setitem(shrink.OVERRIDES, "cpmant", {})
    assert largest_activation(build_model("cpmant", "CpmAntForCausalLM")) > 1000  # at its own init_std


@pytest.mark.sweep  # (an ONNX export: the matrix's row runs it too)
def test_cpm_ant_at_a_trained_scale_exports_to_onnx_within_the_fp32_bound():
    row = run_case("cpmant", "CpmAntForCausalLM", "text-generation", "onnx", "export")
    assert row["status"] == "pass" and row["max_abs_diff"] <= 1e-4, row


def test_a_streaming_audio_prompt_carries_the_audio_of_the_tokens_generate_adds():
    """Voxtral Realtime adds one audio embedding to each position and its generate stops where the audio ends (it
    clamps max_length to the audio's token count): the features of a 9-token prompt alone left no token to generate
    ("Input length of input_ids is 9, but `max_length` is set to 9"), so the matrix recorded eager-fails."""
    import torch

    model = build_model("voxtral_realtime", "VoxtralRealtimeForConditionalGeneration")
    alone = sample_inputs(model, "voxtral_realtime", batch=2, seq=9, for_generation=True)
    prompt = sample_inputs(model, "voxtral_realtime", batch=2, seq=9, for_generation=True, new_tokens=8)
    frames = alone["input_features"].shape[-1]
    assert prompt["input_features"].shape[-1] == frames * 17 // 9  # 8 frames a token, for 9 + 8 tokens
    with torch.no_grad():
        with pytest.raises(ValueError, match="max_length` is set to 9"):
            model.generate(**alone, max_new_tokens=8, do_sample=False)
        assert model.generate(**prompt, max_new_tokens=8, do_sample=False).shape == (2, 17)


def test_a_model_whose_generate_streams_its_encoder_is_refused_by_name():
    """Voxtral Realtime's decode step takes the next audio chunk (encoder_inputs_embeds) and its encoder's own caches:
    a typed refusal naming them, not the ValueError a captured prefill with the whole audio gave."""
    from hfexport import DynamoConfig, DynamoExporter, UnsupportedError

    model = build_model("voxtral_realtime", "VoxtralRealtimeForConditionalGeneration")
    sample = sample_inputs(model, "voxtral_realtime", batch=2, seq=6, for_generation=True, new_tokens=8)
    with pytest.raises(UnsupportedError, match=r"VoxtralRealtimeForConditionalGeneration's generate\(\) streams its "
                       r"encoder.*encoder_past_key_values, encoder_inputs_embeds, padding_cache"):
        DynamoExporter().export_for_generation(model, sample, DynamoConfig(dynamic=True))
