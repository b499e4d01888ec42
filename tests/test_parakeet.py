"""Parakeet from folders transformers saved (issue 59). CTC (`model=parakeet`) computes what transformers'
`ParakeetForCTC` computes (padding to the program's frames changes nothing under the mask), lowers whole
into one engine whose network the reference executor finds right, and `transcribe` (an audio file
through the folder's feature extractor) gives the ids transformers' `generate` and CTC decoding give.
RNN-T and TDT (`model=parakeet_transducer`) lower whole, three methods, and transcribe as transformers'
`generate` does. On the CPU in programs of portable kernels, in pipeline.runtime and in ExecuTorch's
runtime; on a GPU in the TensorRT programs."""

from __future__ import annotations

import json
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
from pipeline.runtime.speech import main as speech_main
from pipeline.runtime.speech import transcribe_ctc, transcribe_transducer
from tests.helpers import gpu

ENCODER = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
           "num_key_value_heads": 2, "subsampling_conv_channels": 16, "conv_kernel_size": 9, "num_mel_bins": 80}
VOCAB, BLANK = 33, 32
FRAMES = "model.methods.encoder.inputs=[{shape: [1, 400, 80]}, {shape: [1, 400], dtype: int64, low: 0, high: 2}]"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random ParakeetForCTC and its feature extractor, as save_pretrained writes them."""
    import transformers

    path = tmp_path_factory.mktemp("parakeet")
    torch.manual_seed(0)
    config = transformers.ParakeetCTCConfig(encoder_config=ENCODER, vocab_size=VOCAB, pad_token_id=BLANK)
    transformers.ParakeetForCTC(config).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def with_extractor(folder: Path) -> Path:
    """The folder with Parakeet's feature extractor saved beside the model, as a user's folder has it."""
    import transformers

    transformers.ParakeetFeatureExtractor().save_pretrained(folder)
    return folder


def _reference(folder: Path) -> Any:
    import transformers

    return transformers.ParakeetForCTC.from_pretrained(folder, local_files_only=True, attn_implementation="eager").eval()


def _wav(path: Path, seconds: float, rate: int = 16000) -> Path:
    import soundfile

    samples = np.random.default_rng(7).standard_normal(int(seconds * rate)).astype(np.float32) * 0.1
    soundfile.write(path, samples, rate)
    return path


def _ctc(sequence: list[int]) -> list[int]:
    return [t for i, t in enumerate(sequence) if t != BLANK and (i == 0 or t != sequence[i - 1])]


def test_the_model_is_transformers_and_padding_changes_nothing(folder: Path) -> None:
    model = objects.model(typed(compose(["model=parakeet", f"model.weights={folder}"])))  # type: ignore[arg-type]
    reference = _reference(folder)
    features = torch.randn(1, 700, 80, generator=torch.Generator().manual_seed(1))
    padded, mask = torch.zeros(1, 1000, 80), torch.zeros(1, 1000, dtype=torch.int64)
    padded[:, :700], mask[:, :700] = features, 1
    with torch.no_grad():
        logits, valid = model.encoder(padded, mask)  # type: ignore[operator]
        alone = reference(input_features=features).logits
    assert int(valid.sum()) == alone.shape[1] and bool(valid[0, :alone.shape[1]].all())
    torch.testing.assert_close(logits[:, :alone.shape[1]], alone, rtol=1e-5, atol=1e-5)


def test_parakeet_builds_whole_and_its_network_is_right(folder: Path, tmp_path: Path) -> None:
    steps.run_all(typed(compose(["model=parakeet", f"model.weights={folder}", "cache=off"])), tmp_path)  # type: ignore[arg-type]
    report = json.loads((tmp_path / "report.json").read_text())["encoder"]
    assert report["left_over"] == [] and report["num_engines"] == 1
    (engine,) = report["engines"]
    assert engine["reference"]["max_rel_error"] <= 1e-3, engine["reference"]


def test_an_audio_file_transcribes_as_transformers_does(with_extractor: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A program of portable kernels (nothing for TensorRT, so it runs on the CPU): from an audio file,
    the ids transformers' feature extractor, generate and CTC decoding give, in both runtimes."""
    import soundfile
    import transformers

    folder = with_extractor
    files = steps.run_all(typed(compose(["model=parakeet", f"model.weights={folder}", "cache=off",  # type: ignore[arg-type]
                                         "compile.min_block_size=100000", FRAMES])), tmp_path / "build")
    wav = _wav(tmp_path / "speech.wav", 1.5)
    features = transformers.ParakeetFeatureExtractor.from_pretrained(folder)(
        soundfile.read(wav, dtype="float32")[0], sampling_rate=16000, return_tensors="pt")["input_features"]
    with torch.no_grad():
        want = _ctc(_reference(folder).generate(input_features=features)[0].tolist())
    assert want  # random weights still say something
    speech_main([str(files["pte"]), "--audio", str(wav), "--model-folder", str(folder)])
    assert capsys.readouterr().out.split() == [str(t) for t in want]  # no tokenizer in the folder: ids only
    assert transcribe_ctc(executorch_runtime.load(files["pte"]), features) == want
    assert _runner_ids(files["pte"], features, 400, tmp_path) == want
    with pytest.raises(InputError, match=r"the program takes one utterance \[1, frames, mels\] of 1..400 frames"):
        transcribe_ctc(load(files["pte"]), torch.randn(1, 401, 80))


def test_what_parakeet_cannot_take_is_one_line(with_extractor: Path, transducers: dict[str, Path], tmp_path: Path) -> None:
    folder = with_extractor
    with pytest.raises(ConfigError, match=r"is a 'ParakeetForTDT' model; build it with model=parakeet_transducer$"):
        objects.model(typed(compose(["model=parakeet", f"model.weights={transducers['tdt']}"])))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"is a 'ParakeetForCTC' model; build it with model=parakeet$"):
        objects.model(typed(compose(["model=parakeet_transducer", f"model.weights={folder}"])))  # type: ignore[arg-type]
    from pipeline.runtime import audio

    with pytest.raises(InputError, match=r"is sampled at 8000 Hz and the model's feature extractor takes 16000 Hz"):
        audio.features(_wav(tmp_path / "low.wav", 0.5, rate=8000), folder)
    (tmp_path / "noise.wav").write_bytes(b"RIFF" + bytes(100))
    with pytest.raises(InputError, match=r"noise.wav is not an audio file soundfile reads"):
        audio.features(tmp_path / "noise.wav", folder)
    with pytest.raises(InputError, match=r"no feature extractor transformers loads"):
        audio.features(_wav(tmp_path / "ok.wav", 0.5), tmp_path)


@pytest.fixture(scope="module")
def transducers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny random ParakeetForRNNT and ParakeetForTDT (their decoder starting on the blank)."""
    import transformers

    out = {}
    for kind, (config, model) in {"rnnt": ("ParakeetRNNTConfig", "ParakeetForRNNT"),
                                  "tdt": ("ParakeetTDTConfig", "ParakeetForTDT")}.items():
        torch.manual_seed(0)
        cfg = getattr(transformers, config)(encoder_config=ENCODER, vocab_size=VOCAB, blank_token_id=BLANK, pad_token_id=0,
                                            decoder_start_token_id=BLANK, decoder_hidden_size=24, num_decoder_layers=2)
        out[kind] = tmp_path_factory.mktemp(kind)
        getattr(transformers, model)(cfg).save_pretrained(out[kind])
    return out


def _transducer_ids(folder: Path, features: torch.Tensor) -> list[int]:
    """What transformers' `generate` transcribes: its sequence less the start token and the blanks."""
    import transformers

    model = transformers.AutoModel.from_pretrained(folder, local_files_only=True, attn_implementation="eager").eval()
    with torch.no_grad():
        return [t for t in model.generate(input_features=features).sequences[0, 1:].tolist() if t != BLANK]


def _runner_ids(pte: Path, features: torch.Tensor, frames: int, tmp: Path) -> list[int]:
    """What the Python-free runner transcribes: `pipeline-runner transcribe` on the features padded to the
    program's `frames` and their mask."""
    from pipeline.runtime.native_library import run_runner

    padded, mask = torch.zeros(1, frames, features.shape[2]), torch.zeros(1, frames, dtype=torch.int64)
    padded[:, :features.shape[1]], mask[:, :features.shape[1]] = features, 1
    np.save(tmp / "features.npy", padded.numpy())
    np.save(tmp / "mask.npy", mask.numpy())
    done = run_runner("transcribe", pte, "--input", tmp / "features.npy", "--input", tmp / "mask.npy")
    assert done.returncode == 0, done.stderr
    return [int(t) for t in done.stdout.split()]


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_a_transducer_folder_transcribes_as_transformers_does(kind: str, transducers: dict[str, Path],
                                                             tmp_path: Path) -> None:
    files = steps.run_all(typed(compose(["model=parakeet_transducer", f"model.weights={transducers[kind]}",  # type: ignore[arg-type]
                                         "model.kwargs.max_frames=400", "cache=off", "compile.min_block_size=100000"])),
                          tmp_path)
    for frames in (120, 400):
        features = torch.randn(1, frames, 80, generator=torch.Generator().manual_seed(frames))
        want = _transducer_ids(transducers[kind], features)
        assert want and transcribe_transducer(load(files["pte"]), features) == want, frames
        assert transcribe_transducer(executorch_runtime.load(files["pte"]), features) == want, frames
        assert _runner_ids(files["pte"], features, 400, tmp_path) == want, frames


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_a_transducer_builds_whole_and_its_networks_are_right(kind: str, transducers: dict[str, Path],
                                                              tmp_path: Path) -> None:
    steps.run_all(typed(compose(["model=parakeet_transducer", f"model.weights={transducers[kind]}", "cache=off"])),  # type: ignore[arg-type]
                  tmp_path)
    report = json.loads((tmp_path / "report.json").read_text())
    assert sorted(report) == ["decoder_step", "encoder", "joint"]
    for method in report.values():
        assert method["left_over"] == [] and method["num_engines"] == 1, method
        (engine,) = method["engines"]
        assert engine["reference"]["max_rel_error"] <= 1e-3, engine["reference"]


# On a GPU: built and run with TF32 off, so that random weights' near ties pick what transformers picks in fp32.
STRICT = ["compile.allow_tf32=false", "cache=off"]


@gpu
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_the_tensorrt_transducer_transcribes_as_transformers_does(kind: str, transducers: dict[str, Path],
                                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    files = steps.run_all(typed(compose(["model=parakeet_transducer", f"model.weights={transducers[kind]}",  # type: ignore[arg-type]
                                         "model.kwargs.max_frames=1200", *STRICT])), tmp_path)
    for frames in (100, 1200):
        features = torch.randn(1, frames, 80, generator=torch.Generator().manual_seed(frames))
        assert transcribe_transducer(load(files["pte"]), features) == _transducer_ids(transducers[kind], features), frames


@gpu
def test_the_runner_runs_the_ctc_program_as_pipeline_runtime_does(folder: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python-free runner (ExecuTorch's C++ runtime, the native delegate) on a padded utterance:
    the logits and mask pipeline.runtime gives, so the same transcription."""
    from pipeline.runtime.native_library import run_runner

    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    files = steps.run_all(typed(compose(["model=parakeet", f"model.weights={folder}", *STRICT])), tmp_path)  # type: ignore[arg-type]
    features, mask = torch.zeros(1, 3000, 80), torch.zeros(1, 3000, dtype=torch.int64)
    features[:, :900] = torch.randn(1, 900, 80, generator=torch.Generator().manual_seed(9))
    mask[:, :900] = 1
    np.save(tmp_path / "f.npy", features.numpy())
    np.save(tmp_path / "m.npy", mask.numpy())
    done = run_runner("run", files["pte"], "--method", "encoder", "--input", tmp_path / "f.npy", "--input", tmp_path / "m.npy",
                      "--output-dir", tmp_path)
    assert done.returncode == 0, done.stderr
    want = load(files["pte"]).method("encoder").execute([features.cuda(), mask.cuda()])
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "output_0.npy")), want[0].cpu(), rtol=1e-4, atol=1e-4)
    assert np.array_equal(np.load(tmp_path / "output_1.npy"), want[1].cpu().numpy())
    assert _runner_ids(files["pte"], features[:, :900], 3000, tmp_path) == transcribe_ctc(load(files["pte"]), features[:, :900])


@gpu
@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
def test_the_runner_transcribes_as_pipeline_runtime_does(kind: str, transducers: dict[str, Path], tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    files = steps.run_all(typed(compose(["model=parakeet_transducer", f"model.weights={transducers[kind]}",  # type: ignore[arg-type]
                                         "model.kwargs.max_frames=1200", *STRICT])), tmp_path)
    features = torch.randn(1, 700, 80, generator=torch.Generator().manual_seed(700))
    assert _runner_ids(files["pte"], features, 1200, tmp_path) == transcribe_transducer(load(files["pte"]), features)


@gpu
def test_the_tensorrt_program_transcribes_as_transformers_does(folder: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NVIDIA_TF32_OVERRIDE", "0")
    files = steps.run_all(typed(compose(["model=parakeet", f"model.weights={folder}", *STRICT])), tmp_path)  # type: ignore[arg-type]
    reference = _reference(folder)
    for seconds in (1.0, 12.0, 30.0):
        frames = int(seconds * 100)
        features = torch.randn(1, frames, 80, generator=torch.Generator().manual_seed(frames))
        with torch.no_grad():
            want = _ctc(reference.generate(input_features=features)[0].tolist())
        assert transcribe_ctc(load(files["pte"]), features) == want, seconds
