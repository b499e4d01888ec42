"""Causal LMs that read images (Gemma 3) and audio (Voxtral), from folders transformers saved (issue 59).
The program's encoder writes the item's rows into its state and its text decoder splices them where the
prompt holds the placeholder, Gemma 3's image tokens attending both ways: teacher-forced, that is the
logits transformers gives; both methods lower whole into one engine each, fp16 and int4 too; greedy
generation from an image file and a prompt through the folder's processor (and from an audio file's
windows) gives the tokens transformers' `generate` gives, in pipeline.runtime and ExecuTorch's runtime
(programs of portable kernels on the CPU, the TensorRT programs on a GPU)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from pipeline import steps
from pipeline.config import objects
from pipeline.config.compose import compose, typed
from pipeline.errors import ConfigError, InputError
from pipeline.runtime import executorch_runtime, load
from pipeline.runtime.audio import text
from pipeline.runtime.generate import generate
from pipeline.runtime.media import audio_inputs, audio_windows, image_inputs, main, media_generate
from pipeline.runtime.native_library import run_runner
from tests.helpers import gpu

IMAGE_TOKEN, ROWS = 299, 4
GEMMA_TEXT = {"vocab_size": 300, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "sliding_window": 6,
              "layer_types": ["sliding_attention", "full_attention"], "max_position_embeddings": 256}
GEMMA_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                "image_size": 32, "patch_size": 8}
GEMMA = ["model=image_text_decoder", "model.kwargs.max_cache_len=48", "model.methods.vision_encoder.inputs.0.shape=[1,3,32,32]"]
AUDIO_TOKEN = 24
VOXTRAL_AUDIO = {"hidden_size": 32, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
                 "num_mel_bins": 16, "max_source_positions": 40}  # windows of 80 frames, 10 rows each
VOXTRAL_TEXT = {"model_type": "llama", "vocab_size": 300, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
                "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 256}
VOXTRAL = ["model=audio_text_decoder", "model.kwargs.max_cache_len=48", "model.kwargs.slots=2",
           "model.methods.audio_encoder.inputs.0.shape=[1,16,80]"]
PORTABLE = ["cache=off", "compile.min_block_size=100000"]  # nothing for TensorRT: runs on the CPU


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Gemma3ForConditionalGeneration and its processor (a word-level tokenizer with
    Gemma 3's image tokens, its image processor), as save_pretrained writes them."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    path = tmp_path_factory.mktemp("gemma3")
    torch.manual_seed(0)
    config = transformers.Gemma3Config(text_config=GEMMA_TEXT, vision_config=GEMMA_VISION, mm_tokens_per_image=ROWS,
                                       image_token_id=IMAGE_TOKEN, boi_token_index=297, eoi_token_index=298)
    transformers.Gemma3ForConditionalGeneration(config).save_pretrained(path)
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>", "<bos>", *(f"w{i}" for i in range(290))])}
    vocab.update({"<start_of_image>": 297, "<end_of_image>": 298, "<image_soft_token>": IMAGE_TOKEN})
    words = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=words, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"})
    images = transformers.Gemma3ImageProcessor(size={"height": 32, "width": 32})
    template = ("{{ bos_token }}{% for m in messages %}w7 {% for c in m['content'] %}{% if c['type'] == 'image' %}"
                "<start_of_image> {% else %}{{ c['text'] }} {% endif %}{% endfor %}w8 {% endfor %}"
                "{% if add_generation_prompt %}w9{% endif %}")  # a turn as Gemma 3's template writes one, in these words
    transformers.Gemma3Processor(image_processor=images, tokenizer=tokenizer, image_seq_length=ROWS,
                                 chat_template=template).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def voxtral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random VoxtralForConditionalGeneration and its feature extractor (0.8 s windows)."""
    import transformers

    path = tmp_path_factory.mktemp("voxtral")
    torch.manual_seed(0)
    config = transformers.VoxtralConfig(audio_config=VOXTRAL_AUDIO, text_config=VOXTRAL_TEXT, audio_token_id=AUDIO_TOKEN)
    transformers.VoxtralForConditionalGeneration(config).save_pretrained(path)
    transformers.WhisperFeatureExtractor(feature_size=16, chunk_length=0.8).save_pretrained(path)
    return path


def _with_chat_processor(voxtral: Path, path: Path) -> Path:
    """The Voxtral folder with Voxtral's processor as save_pretrained writes it: mistral-common's
    tokenizer (`tekken.json`: 40 special tokens, [AUDIO] at Voxtral's 24, then the 256 bytes; 0.8 s
    audio chunks at 12.5 rows a second, the encoder's) and the feature extractor."""
    import base64

    import transformers
    from mistral_common.tokens.tokenizers.base import SpecialTokens

    shutil.copytree(voxtral, path)
    names = iter(t.value for t in SpecialTokens if t.value not in ("[AUDIO]", "[BEGIN_AUDIO]"))
    special = [{"rank": r, "token_str": {24: "[AUDIO]", 25: "[BEGIN_AUDIO]"}.get(r) or next(names, f"<SPECIAL_{r}>"),
                "is_control": True} for r in range(40)]
    tekken = {"config": {"pattern": r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+", "num_vocab_tokens": 256,
                         "default_vocab_size": 296, "default_num_special_tokens": 40, "version": "v7"},
              "vocab": [{"rank": i, "token_bytes": base64.b64encode(bytes([i])).decode(), "token_str": None} for i in range(256)],
              "special_tokens": special, "version": 1, "type": "Tekken",
              "audio": {"sampling_rate": 16000, "frame_rate": 12.5, "chunk_length_s": 0.8,
                        "audio_encoding_config": {"num_mel_bins": 16, "hop_length": 160, "window_size": 400}}}
    (path / "tekken.json").write_text(json.dumps(tekken))
    transformers.VoxtralProcessor(feature_extractor=transformers.WhisperFeatureExtractor(feature_size=16, chunk_length=0.8),
                                  tokenizer=transformers.MistralCommonBackend.from_pretrained(str(path))).save_pretrained(path)
    return path


def _reference(folder: Path) -> Any:
    import transformers

    if "voxtral" in folder.name:
        return transformers.VoxtralForConditionalGeneration.from_pretrained(folder, local_files_only=True)
    return transformers.AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True)


def _png(path: Path, seed: int = 0) -> Path:
    from PIL import Image

    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (40, 52, 3), dtype=np.uint8)).save(path)
    return path


def _wav(path: Path, seconds: float) -> Path:
    import soundfile

    soundfile.write(path, np.random.default_rng(5).standard_normal(int(seconds * 16000)).astype(np.float32) * 0.1, 16000)
    return path


def _build(overrides: list[str], folder: Path) -> Any:
    return objects.model(typed(compose([*overrides, f"model.weights={folder}"])))  # type: ignore[arg-type]


def test_gemma3_steps_give_transformers_logits(gemma: Path) -> None:
    """Teacher-forced over a prompt longer than the sliding window, in two steps: an image's tokens
    attend to each other both ways (its token types), the sliding layers within their window."""
    model, reference = _build(GEMMA, gemma), _reference(gemma).eval()
    ids = torch.tensor([[2, 5, 297, *[IMAGE_TOKEN] * ROWS, 298, 7, 8, 9, 10, 11, 12]])
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = reference(input_ids=ids, pixel_values=pixels, token_type_ids=(ids == IMAGE_TOKEN).long()).logits
        model.vision_encoder(pixels, torch.tensor([0]))
        got = torch.cat([model.text_decoder(ids[:, :10], torch.tensor([0])), model.text_decoder(ids[:, 10:], torch.tensor([10]))], 1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_voxtral_steps_give_transformers_logits(voxtral: Path) -> None:
    model, reference = _build(VOXTRAL, voxtral), _reference(voxtral).eval()
    ids = torch.tensor([[1, 5, *[AUDIO_TOKEN] * 20, 7, 8]])
    features = torch.randn(2, 16, 80, generator=torch.Generator().manual_seed(0))  # two windows
    with torch.no_grad():
        want = reference(input_ids=ids, input_features=features).logits
        for slot in range(2):
            model.audio_encoder(features[slot:slot + 1], torch.tensor([slot]))
        got = model.text_decoder(ids, torch.tensor([0]))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family, precision", [("gemma", "fp32"), ("gemma", "int4"), ("voxtral", "fp16")])
def test_both_methods_lower_whole(family: str, precision: str, gemma: Path, voxtral: Path, tmp_path: Path) -> None:
    folder, overrides = (gemma, GEMMA) if family == "gemma" else (voxtral, VOXTRAL)
    more = {"fp32": [], "fp16": ["compile=fp16", "model.kwargs.dtype=float16"],
            "int4": ["compile=fp16", "model.kwargs.dtype=float16", "compile.quantize.mode=int4_weight_only",
                     "compile.quantize.group_size=32"]}[precision]
    steps.run_all(typed(compose([*overrides, f"model.weights={folder}", "cache=off", *more])), tmp_path)  # type: ignore[arg-type]
    report = json.loads((tmp_path / "report.json").read_text())
    assert sorted(report) == sorted(["text_decoder", "vision_encoder" if family == "gemma" else "audio_encoder"])
    for method in report.values():
        assert method["left_over"] == [] and method["num_engines"] == 1, method
        (engine,) = method["engines"]
        if precision == "int4":  # the reference executor has no int4 weights: the engines' numbers are the GPU's to check
            assert engine["quantized"]["layers"]["linear"] >= 8 and "INT4" in engine["reference"]["skipped"], engine
        else:
            assert engine["reference"]["max_rel_error"] <= (1e-3 if precision == "fp32" else 3e-2), engine["reference"]


def _transformers_tokens(folder: Path, new: int, **inputs: torch.Tensor) -> list[int]:
    with torch.no_grad():
        out = _reference(folder).eval().generate(**inputs, max_new_tokens=new, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def test_an_image_and_a_prompt_generate_as_transformers_does(gemma: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """From an image file and a text prompt through the folder's processor, in both runtimes and the
    command; the program's state rows are replaced by the next image (a second call, another image)."""
    files = steps.run_all(typed(compose([*GEMMA, f"model.weights={gemma}", *PORTABLE])), tmp_path / "build")  # type: ignore[arg-type]
    for seed in (0, 1):
        png = _png(tmp_path / f"picture{seed}.png", seed)
        ids, pixels = image_inputs(png, gemma, "w1 w2 w3")
        assert ids is not None and ids[0].tolist() == [2, 10, 297, *[IMAGE_TOKEN] * ROWS, 298, 4, 5, 6, 11, 12]  # the chat template's
        want = _transformers_tokens(gemma, 6, input_ids=ids, pixel_values=pixels, token_type_ids=(ids == IMAGE_TOKEN).long())
        for program in (load(files["pte"]), executorch_runtime.load(files["pte"])):
            assert media_generate(program, ids, [pixels], 6)[0, ids.shape[1]:].tolist() == want, seed
        assert _runner_tokens(files["pte"], ids, pixels, 6, tmp_path) == want, seed
    main([str(files["pte"]), "--image", str(png), "--prompt", "w1 w2 w3", "--model-folder", str(gemma), "--max-new-tokens", "6"])
    words = {i: w for w, i in json.loads((gemma / "tokenizer.json").read_text())["model"]["vocab"].items()}
    assert capsys.readouterr().out.split() == [words[t] for t in want if t > 2]  # special tokens are not shown


def test_pan_and_scan_crops_are_items_as_transformers_makes_them(gemma: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`--pan-and-scan` (Gemma 3): the processor cuts a wide image into crops, each an item in a slot of
    its own with its own placeholders, and the tokens are transformers' from the same pixels; a program
    of fewer slots than items refuses before anything runs."""
    from PIL import Image

    wide = tmp_path / "wide.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (300, 1100, 3), dtype=np.uint8)).save(wide)
    ids, pixels = image_inputs(wide, gemma, "w1 w2", pan_and_scan=True)
    assert ids is not None and pixels.shape[0] > 1 and int((ids == IMAGE_TOKEN).sum()) == ROWS * pixels.shape[0]
    slots = [f"model.kwargs.slots={pixels.shape[0]}", "model.kwargs.max_cache_len=96"]
    files = steps.run_all(typed(compose([*GEMMA, *slots, f"model.weights={gemma}", *PORTABLE])), tmp_path / "b")  # type: ignore[arg-type]
    want = _transformers_tokens(gemma, 5, input_ids=ids, pixel_values=pixels, token_type_ids=(ids == IMAGE_TOKEN).long())
    for program in (load(files["pte"]), executorch_runtime.load(files["pte"])):
        assert media_generate(program, ids, list(pixels.split(1)), 5)[0, ids.shape[1]:].tolist() == want
    assert _runner_tokens(files["pte"], ids, pixels, 5, tmp_path) == want  # every item, each in its slot
    main([str(files["pte"]), "--image", str(wide), "--pan-and-scan", "--prompt", "w1 w2", "--model-folder", str(gemma),
          "--max-new-tokens", "5", "--runtime", "executorch"])
    words = {i: w for w, i in json.loads((gemma / "tokenizer.json").read_text())["model"]["vocab"].items()}
    assert capsys.readouterr().out.split() == [words[t] for t in want if t > 2]
    one = steps.run_all(typed(compose([*GEMMA, "model.kwargs.max_cache_len=96", f"model.weights={gemma}", *PORTABLE])),  # type: ignore[arg-type]
                        tmp_path / "one")
    with pytest.raises(InputError, match=rf"{pixels.shape[0]} image items given; the program holds 1 \(model.kwargs.slots\)"):
        media_generate(load(one["pte"]), ids, list(pixels.split(1)), 5)


def _siglip_processor(path: Path) -> Path:
    """A folder of SigLIP's image processor alone (it cuts no crops)."""
    import transformers

    transformers.SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(path)
    return path


def _runner_tokens(pte: Path, ids: torch.Tensor, items: torch.Tensor, new: int, tmp: Path, encoder: str = "vision_encoder") -> list[int]:
    """What the native runner generates, its encoder run first on each of `items` [n, ...] into slots 0..n-1."""
    files: list[Any] = []
    for slot, item in enumerate(items.split(1)):
        np.save(tmp / f"item{slot}.npy", item.numpy())
        np.save(tmp / f"slot{slot}.npy", np.array([slot], dtype=np.int64))
        files += ["--input", tmp / f"item{slot}.npy", "--input", tmp / f"slot{slot}.npy"]
    done = run_runner("generate", pte, "--prompt", " ".join(map(str, ids[0].tolist())), "--max-new-tokens", new,
                      "--prefill", "text_decoder", "--decode", "text_decoder", "--encoder", encoder, *files)
    assert done.returncode == 0, done.stderr
    return [int(t) for t in done.stdout.splitlines()[0].split()]


def test_an_audio_file_generates_as_transformers_does(voxtral: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An audio file of 1.2 s: two windows of 0.8 s (the last padded), 20 placeholders; the prompt's ids
    as given, or made by Voxtral's processor (mistral-common's) from a text prompt or as a transcription
    request."""
    import transformers

    files = steps.run_all(typed(compose([*VOXTRAL, f"model.weights={voxtral}", *PORTABLE])), tmp_path / "build")  # type: ignore[arg-type]
    wav = _wav(tmp_path / "speech.wav", 1.2)
    windows = audio_windows(wav, voxtral, 80)
    assert [tuple(w.shape) for w in windows] == [(1, 16, 80), (1, 16, 80)]
    ids = torch.tensor([[1, 5, *[AUDIO_TOKEN] * 20, 7]])
    want = _transformers_tokens(voxtral, 6, input_ids=ids, input_features=torch.cat(windows))
    for program in (load(files["pte"]), executorch_runtime.load(files["pte"])):
        assert media_generate(program, ids, windows, 6)[0, ids.shape[1]:].tolist() == want
    with pytest.raises(InputError, match=r"the audio items are of shapes \[\[1, 16, 80\], \[1, 16, 40\]\]; the encoder takes one"):
        media_generate(program, ids, [windows[0], windows[1][..., :40]], 6)
    main([str(files["pte"]), "--audio", str(wav), "--prompt-ids", " ".join(map(str, ids[0].tolist())),
          "--model-folder", str(voxtral), "--max-new-tokens", "6"])
    assert capsys.readouterr().out.split() == [str(t) for t in want]  # no tokenizer in the folder: ids
    chat = _with_chat_processor(voxtral, tmp_path / "chat")  # a text prompt: the folder's processor makes the ids
    ids, windows = audio_inputs(wav, chat, 80, "what is said")
    assert ids[0, :3].tolist() == [1, 3, 25] and int((ids == AUDIO_TOKEN).sum()) == 20 and len(windows) == 2
    want = _transformers_tokens(voxtral, 6, input_ids=ids, input_features=torch.cat(windows))
    assert media_generate(program, ids, windows, 6)[0, ids.shape[1]:].tolist() == want
    main([str(files["pte"]), "--audio", str(wav), "--prompt", "what is said", "--model-folder", str(chat),
          "--max-new-tokens", "6"])
    assert capsys.readouterr().out.strip() == text(want, chat).strip()  # by the folder's tokenizer: mistral-common's
    ids, windows = audio_inputs(wav, chat, 80, language="en")  # a transcription request: [TRANSCRIBE] after the audio
    transcribe = transformers.MistralCommonBackend.from_pretrained(str(chat)).convert_tokens_to_ids("[TRANSCRIBE]")
    assert ids[0, :3].tolist() == [1, 3, 25] and int((ids == AUDIO_TOKEN).sum()) == 20 and transcribe in ids[0].tolist()
    want = _transformers_tokens(voxtral, 4, input_ids=ids, input_features=torch.cat(windows))
    main([str(files["pte"]), "--audio", str(wav), "--transcribe", "--language", "en", "--model-folder", str(chat),
          "--max-new-tokens", "4"])
    assert capsys.readouterr().out.strip() == text(want, chat).strip()
    for wrong, line in ((["--language", "en", "--prompt", "x"], "--language is the language --transcribe asks for"),
                        (["--transcribe", "--image", str(wav)], "--transcribe transcribes audio")):
        with pytest.raises(SystemExit):
            main([str(files["pte"]), *wrong, *([] if "--image" in wrong else ["--audio", str(wav)]), "--model-folder", str(chat)])
        assert f"error: {line}" in capsys.readouterr().err
    with pytest.raises(InputError, match=r"--prompt or --transcribe with --audio: the folder's \w+ makes no prompt of audio "
                                         r"\(Voxtral's does\); give the prompt as ids \(--prompt-ids\)"):
        audio_inputs(wav, _siglip_processor(tmp_path / "siglip"), 80, "what is said")


def test_what_a_multimodal_program_cannot_take_is_one_line(gemma: Path, voxtral: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    with pytest.raises(ConfigError, match=r"is a 'gemma3' model, which reads image: build it with model=image_text_decoder$"):
        _build(VOXTRAL, gemma)
    with pytest.raises(ConfigError, match=r"is a 'voxtral' model, which reads audio: build it with model=audio_text_decoder$"):
        _build(GEMMA, voxtral)
    with pytest.raises(ConfigError, match=r"model.methods.vision_encoder.inputs\[0\] has shape \[1, 3, 48, 48\]; the folder's "
                                          r"model takes \[1, 3, 32, 32\]: set model.methods.vision_encoder.inputs.0.shape=\[1,3,32,32\]$"):
        steps.run_all(typed(compose([*GEMMA, f"model.weights={gemma}", "cache=off",  # type: ignore[arg-type]
                                     "model.methods.vision_encoder.inputs.0.shape=[1,3,48,48]"])), tmp_path / "wrong")
    with pytest.raises(ConfigError, match=r"model=image_text_decoder builds from a Hugging Face model folder \(model.weights"):
        objects.model(typed(compose(GEMMA)))  # type: ignore[arg-type]
    files = steps.run_all(typed(compose([*GEMMA, f"model.weights={gemma}", *PORTABLE])), tmp_path / "build")  # type: ignore[arg-type]
    program = load(files["pte"])
    pixels = torch.randn(1, 3, 32, 32)
    ids = torch.tensor([[2, *[IMAGE_TOKEN] * ROWS, 5]])
    media_generate(program, ids, [pixels], 3)
    start = torch.zeros(1, dtype=torch.int64)
    before = program.method("text_decoder").execute([ids, start])[0]
    with pytest.raises(InputError, match=r"the prompt holds 3 placeholder tokens \(id 299\); 1 image item\(s\) of 4 rows each "
                                         r"need 4: make the prompt with the model's processor"):
        media_generate(program, ids[:, 2:], [torch.randn(1, 3, 32, 32)], 3)
    with pytest.raises(InputError, match=r"2 image items given; the program holds 1 \(model.kwargs.slots\)"):
        media_generate(program, ids, [pixels, pixels], 3)
    with pytest.raises(InputError, match=r"method 'vision_encoder' input 0"):  # the encoder's own check, before it runs
        media_generate(program, ids, [torch.randn(1, 3, 16, 16)], 3)
    with pytest.raises(InputError, match=r"need 52 cache positions; the program's cache holds 48"):
        media_generate(program, ids, [torch.randn(1, 3, 32, 32)], 47)
    np.save(tmp_path / "pixels.npy", pixels.numpy())
    for slot in (0, 1):
        np.save(tmp_path / f"slot{slot}.npy", np.array([slot], dtype=np.int64))
    item = ["--input", tmp_path / "pixels.npy", "--input", tmp_path / "slot0.npy"]
    for extra, line in (
            ([], "--encoder vision_encoder takes 2 --input files per item, got 0: give each item's files in turn (its data, "
                 "then its slot)"),
            (item, "the prompt holds 0 placeholder tokens (id 299); the 1 item(s) --encoder reads stand for 4: make the "
                   "prompt with the model's processor"),
            ([*item, *item], f"two items --encoder reads go to one slot ({tmp_path / 'slot0.npy'}): give each item a slot of "
                             "its own"),
            ([*item, "--input", tmp_path / "pixels.npy", "--input", tmp_path / "slot1.npy"],
             "method 'vision_encoder' input 1 holds 1, but the program takes values 0..0")):
        done = run_runner("generate", files["pte"], "--prompt", "2 5 6", "--prefill", "text_decoder", "--decode",
                          "text_decoder", "--encoder", "vision_encoder", *extra)
        assert done.stderr.strip().splitlines()[-1].startswith(f"pipeline-runner: {line}"), done.stderr
    with pytest.raises(InputError, match=r"the prompt holds the program's image or audio placeholder token \(299\); run "
                                         r"it with pipeline.runtime.media"):
        generate(program, ids, 3, "text_decoder", "text_decoder")  # the rows would be of no item given
    done = run_runner("transcribe", files["pte"], "--input", "f.npy", "--input", "m.npy")
    assert done.stderr.strip().splitlines()[-1] == ("pipeline-runner: the program is not a Parakeet program (no ctc_blank_id, "
                                                    "or blank_id and joint); build one with model=parakeet or "
                                                    "model=parakeet_transducer")
    # The refusals ran nothing: the state holds the first image's rows still (other pixels would change them).
    torch.testing.assert_close(program.method("text_decoder").execute([ids, start])[0], before, rtol=0, atol=0)
    (tmp_path / "not.png").write_bytes(b"\x89PNG" + bytes(40))
    with pytest.raises(InputError, match=r"not.png is not an image Pillow reads"):
        image_inputs(tmp_path / "not.png", gemma, "w1")
    with pytest.raises(InputError, match=r"no processor transformers loads"):
        image_inputs(_png(tmp_path / "ok.png"), tmp_path, "w1")
    plain = Path(shutil.copytree(gemma, tmp_path / "plain"))
    (plain / "chat_template.jinja").unlink()  # no chat template: the prompt follows the image's token
    ids, _ = image_inputs(tmp_path / "ok.png", plain, "w1")
    assert ids is not None and ids[0].tolist() == [297, *[IMAGE_TOKEN] * ROWS, 298, 4]
    wide = Path(tmp_path / "wide.png")
    Image.fromarray(np.zeros((300, 1100, 3), dtype=np.uint8)).save(wide)
    ids, crops = image_inputs(wide, plain, "w1", pan_and_scan=True)  # no chat template: the processor's own text
    assert ids is not None and int((ids == IMAGE_TOKEN).sum()) == ROWS * crops.shape[0] > ROWS
    with pytest.raises(InputError, match=r"^--pan-and-scan: the folder's \w+ cuts no crops \(Gemma 3's does\); leave it out$"):
        image_inputs(wide, _siglip_processor(tmp_path / "siglip"), "w1", pan_and_scan=True)
    with pytest.raises(SystemExit):
        main([str(files["pte"]), "--audio", "x.wav", "--pan-and-scan", "--prompt-ids", "1", "--model-folder", str(voxtral)])
    assert "error: --pan-and-scan crops images: leave it out with --audio " in capsys.readouterr().err
    with pytest.raises(InputError, match=r"method 'vision_encoder' input 1 holds 1, but the program takes values 0..0"):
        program.method("vision_encoder").execute([pixels, torch.tensor([1])])  # a slot the program does not have


@pytest.mark.skipif(shutil.which("dvc") is None, reason="needs the dvc command")
def test_one_dvc_repro_builds_a_program_from_a_folder(gemma: Path, tmp_path: Path) -> None:
    """What a user types: the folder in the project, one compose, one `dvc repro` (every stage)."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    for item in ("conf", "stages", "pipeline", "hydra_plugins", "dvc.yaml", "params.yaml", ".dvcignore"):
        (shutil.copytree if (root / item).is_dir() else shutil.copy)(root / item, tmp_path / item)
    shutil.copytree(gemma, tmp_path / "models" / "gemma3")
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"],
                    [sys.executable, "-m", "pipeline.config.compose", *GEMMA, "model.weights=models/gemma3"], ["dvc", "repro"]):
        done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=900)
        assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads((tmp_path / "build" / "image_text_decoder" / "report.json").read_text())
    assert {name: (m["num_engines"], m["left_over"]) for name, m in report.items()} == {
        "vision_encoder": (1, []), "text_decoder": (1, [])}
    assert (tmp_path / "build" / "image_text_decoder" / "program" / "image_text_decoder.pte").stat().st_size > 100_000


def _folder(path: Path, family: str) -> Path:
    """A tiny random image-text model of a family the issue does not name, as save_pretrained writes it."""
    import transformers

    torch.manual_seed(0)
    text = {"vocab_size": 120, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 2,
            "num_key_value_heads": 1}
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "image_size": 32,
              "patch_size": 8}
    if family == "llava":  # CLIP's patches less its class token, projected: 16 rows
        config = transformers.LlavaConfig(vision_config={"model_type": "clip_vision_model", **vision},
                                          text_config={"model_type": "llama", **text}, image_token_id=100, image_seq_length=16)
        transformers.LlavaForConditionalGeneration(config).save_pretrained(path)
    else:  # PaliGemma: its prompt attends both ways (token types), its images are its prefix
        config = transformers.PaliGemmaConfig(vision_config=vision, text_config={**text, "head_dim": 24}, image_token_index=100)
        transformers.PaliGemmaForConditionalGeneration(config).save_pretrained(path)
    return path


def test_an_image_text_family_no_test_names_builds_checked_or_is_refused(tmp_path: Path) -> None:
    """LLaVA (its rows replace its image tokens): the build checks the spliced step against transformers,
    and the program generates what transformers generates; PaliGemma (a prefix attending both ways):
    refused in one line."""
    llava = _folder(tmp_path / "llava", "llava")
    overrides = ["model=image_text_decoder", f"model.weights={llava}", "model.kwargs.max_cache_len=40",
                 "model.methods.vision_encoder.inputs.0.shape=[1,3,32,32]"]
    files = steps.run_all(typed(compose([*overrides, *PORTABLE])), tmp_path / "build")  # type: ignore[arg-type]
    ids = torch.tensor([[1, 7, *[100] * 16, 9, 4]])
    pixels = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    want = _transformers_tokens(llava, 6, input_ids=ids, pixel_values=pixels)
    assert media_generate(load(files["pte"]), ids, [pixels], 6)[0, ids.shape[1]:].tolist() == want
    with pytest.raises(ConfigError, match=r"a PaliGemmaForConditionalGeneration places its images by token_type_ids besides "
                                          r"their tokens, which model=image_text_decoder does not make"):
        _build(["model=image_text_decoder"], _folder(tmp_path / "paligemma", "paligemma"))


# On a GPU: built and run with TF32 off, so that random weights' near ties pick what transformers picks in fp32.
STRICT = ["compile.allow_tf32=false", "cache=off"]


@gpu
def test_the_tensorrt_gemma3_program_generates_as_transformers_does(gemma: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    files = steps.run_all(typed(compose([*GEMMA, f"model.weights={gemma}", *STRICT])), tmp_path)  # type: ignore[arg-type]
    ids, pixels = image_inputs(_png(tmp_path / "picture.png"), gemma, "w1 w2 w3")
    assert ids is not None
    want = _transformers_tokens(gemma, 8, input_ids=ids, pixel_values=pixels, token_type_ids=(ids == IMAGE_TOKEN).long())
    assert media_generate(load(files["pte"]), ids, [pixels], 8)[0, ids.shape[1]:].tolist() == want
    assert _runner_tokens(files["pte"], ids, pixels, 8, tmp_path) == want


@gpu
def test_the_tensorrt_voxtral_program_generates_as_transformers_does(voxtral: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    files = steps.run_all(typed(compose([*VOXTRAL, f"model.weights={voxtral}", *STRICT])), tmp_path)  # type: ignore[arg-type]
    windows = audio_windows(_wav(tmp_path / "speech.wav", 1.2), voxtral, 80)
    ids = torch.tensor([[1, 5, *[AUDIO_TOKEN] * 20, 7]])
    want = _transformers_tokens(voxtral, 8, input_ids=ids, input_features=torch.cat(windows))
    assert media_generate(load(files["pte"]), ids, windows, 8)[0, ids.shape[1]:].tolist() == want
    one = torch.tensor([[1, 5, *[AUDIO_TOKEN] * 10, 7]])  # the runner runs one window
    want = _transformers_tokens(voxtral, 8, input_ids=one, input_features=windows[0])
    assert _runner_tokens(files["pte"], one, windows[0], 8, tmp_path, "audio_encoder") == want
