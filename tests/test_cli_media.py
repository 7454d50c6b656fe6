"""``hfexport run --image`` and ``--audio``, and ``hfexport export`` of image-text-to-text and speech models from a
folder holding their processor.

Two tiny models with real processors, built offline: a LLaVA (CLIP 16x16 vision tower + Llama) whose processor is
SmolLM2's tokenizer plus an ``<image>`` token and a CLIP image processor, and a Whisper whose feature extractor
makes 32 frames from a second of 16 kHz audio. Each is exported by the CLI from its folder, then run on a file;
the text must be eager ``model.generate``'s on the same file, read and processed here by the test itself.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from hfexport.cli import main
from hfexport.cli.media import load_audio, load_image
from hfexport.errors import UnsupportedError

NEW_TOKENS = 8
# the ChatML template of SmolLM2, with an image placeholder for content parts of type "image"
_CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
         "{% else %}{% for c in m['content'] %}{% if c['type'] == 'image' %}<image>{% else %}{{ c['text'] }}"
         "{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}"
         "<|im_start|>assistant\n{% endif %}")


def _llava_folder(tokenizer, folder):
    from transformers import (CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    tok = type(tokenizer).from_pretrained(tokenizer.name_or_path, local_files_only=True)
    tok.add_special_tokens({"additional_special_tokens": ["<image>"]})
    image_id = tok.convert_tokens_to_ids("<image>")
    processor = LlavaProcessor(
        image_processor=CLIPImageProcessor(size={"shortest_edge": 16}, crop_size={"height": 16, "width": 16}),
        tokenizer=tok, patch_size=4, vision_feature_select_strategy="default", num_additional_image_tokens=1,
        image_token="<image>", chat_template=_CHAT,
    )
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, projection_dim=32, num_hidden_layers=2,
                              num_attention_heads=2, image_size=16, patch_size=4)
    text = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    config = LlavaConfig(vision_config=vision.to_dict(), text_config=text.to_dict(), image_token_index=image_id,
                         image_seq_length=16, vision_feature_layer=-1, vision_feature_select_strategy="default")
    torch.manual_seed(0)
    model = LlavaForConditionalGeneration(config).eval()
    model.generation_config.do_sample = False
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return model, processor


def _whisper_folder(tokenizer, folder):
    from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    extractor = WhisperFeatureExtractor(feature_size=8, sampling_rate=16000, hop_length=500, chunk_length=1,
                                        n_fft=1024)
    ids = dict(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
               eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id)
    # init_std=0.2: with the default 0.02 every input decodes to the same tokens
    config = WhisperConfig(vocab_size=len(tokenizer), num_mel_bins=8, d_model=64, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                           decoder_ffn_dim=128, max_source_positions=16, max_target_positions=64,
                           suppress_tokens=None, begin_suppress_tokens=None, init_std=0.2, tie_word_embeddings=False,
                           **ids)
    torch.manual_seed(0)
    model = WhisperForConditionalGeneration(config).eval()
    model.generation_config = GenerationConfig(do_sample=False, **ids)
    model.save_pretrained(folder)
    extractor.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model, extractor


@pytest.fixture(scope="module")
def llava(tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("llava")
    model, processor = _llava_folder(tokenizer, root / "model")
    assert main(["export", str(root / "model"), "--format", "dynamo", "-o", str(root / "export"), "--json"]) == 0
    from PIL import Image

    image = root / "picture.png"
    Image.fromarray(np.random.default_rng(5).integers(0, 256, (40, 30, 3), dtype=np.uint8)).save(image)
    return model, processor, root / "export", image


@pytest.fixture(scope="module")
def whisper(tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("whisper")
    model, extractor = _whisper_folder(tokenizer, root / "model")
    assert main(["export", str(root / "model"), "--format", "dynamo", "-o", str(root / "export"), "--json"]) == 0
    return model, extractor, root / "export", root


def _eager_new_tokens(model, inputs, prompt_len):
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, prompt_len:].tolist()


def test_export_of_an_image_text_model_keeps_its_processor(llava):
    _, _, export, _ = llava
    manifest = json.loads((export / "export.json").read_text())
    assert {"image_encoder", "language_model", "decode"} <= set(manifest["components"])
    assert (export / "processor_config.json").is_file() and (export / "tokenizer.json").is_file()


def test_run_image_in_a_fresh_process_gives_eager_text(llava):
    """A real ``hfexport`` process: it never imported the LLaVA modeling module, whose output class the decode
    program's tree spec names."""
    from PIL import Image

    model, processor, export, image = llava
    prompt = "What is in the picture?"
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": prompt}]}],
        add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[text], images=[Image.open(image).convert("RGB")], return_tensors="pt")
    assert (inputs["input_ids"] == model.config.image_token_index).sum() == 16  # the image is in the prompt
    expected = _eager_new_tokens(model, dict(inputs), inputs["input_ids"].shape[-1])
    proc = subprocess.run(
        [sys.executable, "-m", "hfexport.cli", "run", str(export), "--image", str(image), "--prompt", prompt,
         "--max-new-tokens", str(NEW_TOKENS), "--json"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout)
    assert result["token_ids"] == expected
    assert result["text"] == processor.tokenizer.decode(expected, skip_special_tokens=True)
    assert result["prompt_tokens"] == inputs["input_ids"].shape[-1]


def test_run_image_depends_on_the_image(llava, tmp_path, capsys):
    model, processor, export, image = llava
    other = tmp_path / "other.png"
    from PIL import Image

    Image.fromarray(np.full((16, 16, 3), 255, dtype=np.uint8)).save(other)
    got = {}
    for path in (image, other):
        assert main(["run", str(export), "--image", str(path), "--prompt", "Hi", "--max-new-tokens",
                     str(NEW_TOKENS), "--json"]) == 0
        got[path] = json.loads(capsys.readouterr().out)["token_ids"]
    assert got[image] != got[other]  # else the check above would not see a dropped image


def test_run_audio_gives_eager_transcript(whisper, capsys):
    from scipy.io import wavfile

    model, extractor, export, root = whisper
    samples = (np.sin(np.arange(16000) / 16000 * 2 * np.pi * 300) * 0.3 * 32767).astype(np.int16)
    wav = root / "speech.wav"
    wavfile.write(wav, 16000, samples)
    features = extractor(samples.astype(np.float32) / 32768, sampling_rate=16000, return_tensors="pt")
    with torch.no_grad():
        silent = model.generate(input_features=extractor(np.zeros(16000, np.float32), sampling_rate=16000,
                                                         return_tensors="pt").input_features,
                                max_new_tokens=NEW_TOKENS, do_sample=False)
        expected = model.generate(input_features=features.input_features, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert not torch.equal(silent, expected)  # the transcript depends on the audio
    assert main(["run", str(export), "--audio", str(wav), "--max-new-tokens", str(NEW_TOKENS), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    new = expected[0].tolist()  # Whisper's generate returns the new tokens only
    assert result["token_ids"] == new
    assert result["new_tokens"] == NEW_TOKENS and result["prompt_tokens"] == 0


@pytest.mark.parametrize("argv, message", [
    (["--chat"], "--chat takes text turns only"),
    (["--audio", "x.wav"], "--image and --audio exclude each other"),
])
def test_run_refuses_media_combinations(llava, argv, message, capsys):
    _, _, export, image = llava
    assert main(["run", str(export), "--image", str(image), *argv]) == 2
    assert message in capsys.readouterr().err


def test_run_refuses_a_prompt_with_audio(whisper, capsys):
    _, _, export, root = whisper
    assert main(["run", str(export), "--audio", str(root / "none.wav"), "--prompt", "hi"]) == 2
    assert "--prompt with --audio" in capsys.readouterr().err


def test_load_audio_resamples_mixes_and_scales(tmp_path):
    from scipy.io import wavfile

    rate, seconds, freq = 8000, 0.5, 440.0
    t = np.arange(int(rate * seconds)) / rate
    left = np.sin(2 * np.pi * freq * t) * 0.5
    stereo = np.stack([left, left * 0.0], axis=1)  # the mix is half the left channel
    path = tmp_path / "tone.wav"
    wavfile.write(path, rate, (stereo * 32767).astype(np.int16))
    audio = load_audio(path, 16000)
    assert audio.dtype == np.float32 and audio.shape == (int(16000 * seconds),)
    spectrum = np.abs(np.fft.rfft(audio))
    peak_hz = np.argmax(spectrum) * 16000 / audio.shape[0]
    assert abs(peak_hz - freq) <= 2.0
    assert abs(np.abs(audio[200:-200]).max() - 0.25) < 0.01  # int16 scaled to [-1, 1], channels averaged


def test_load_audio_reads_unsigned_8bit_around_zero(tmp_path):
    from scipy.io import wavfile

    path = tmp_path / "u8.wav"
    wavfile.write(path, 16000, np.full(1600, 128, dtype=np.uint8))
    assert np.abs(load_audio(path, 16000)).max() == 0.0


def test_load_audio_refuses_other_formats_with_the_ffmpeg_line(tmp_path):
    path = tmp_path / "speech.mp3"
    path.write_bytes(b"ID3")
    with pytest.raises(UnsupportedError, match=r"ffmpeg -i .*speech\.mp3 -ac 1 -ar 16000 .*speech\.wav"):
        load_audio(path, 16000)


def test_load_audio_and_image_name_the_bad_file(tmp_path):
    bad = tmp_path / "noise.wav"
    bad.write_bytes(b"not a wav at all")
    with pytest.raises(UnsupportedError, match="noise.wav: not a WAV file"):
        load_audio(bad, 16000)
    picture = tmp_path / "picture.png"
    picture.write_bytes(b"not a png")
    with pytest.raises(UnsupportedError, match="picture.png: not an image"):
        load_image(picture)
    with pytest.raises(UnsupportedError, match="no such file"):
        load_image(tmp_path / "absent.png")
