"""An audio file as a speech program takes it: read by soundfile (from a bounded regular file), made
into log-mel features by the model folder's own feature extractor (transformers' `AutoFeatureExtractor`:
Whisper's [1, mels, frames], Parakeet's [1, frames, mels]), and the transcribed ids made text by the
folder's tokenizer where it has one."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import InputError, first_line
from pipeline.files import read_regular

AUDIO_LIMIT = 1 << 30  # bytes of an audio file


def samples(audio: str | Path) -> tuple[Any, int]:
    """The samples of `audio` (its channels averaged, float32) and their rate, read by soundfile.

    Raises:
        InputError: the file is not audio soundfile reads.
    """
    import soundfile

    data = read_regular(audio, "--audio", AUDIO_LIMIT, InputError)
    try:
        read, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except (soundfile.LibsndfileError, RuntimeError, TypeError) as exc:
        raise InputError(f"{audio} is not an audio file soundfile reads ({first_line(exc)}); give a WAV, FLAC or OGG "
                         "file") from None
    return read.mean(axis=1), int(rate)


def features(audio: str | Path, folder: str | Path, pad_to_frames: int | None = None) -> torch.Tensor:
    """The log-mel features of `audio` (`samples`) as the feature extractor of the model `folder` makes
    them; with `pad_to_frames`, the whole audio padded to a multiple of that many frames (as Voxtral's
    processor pads it into 30 s windows), never cut.

    Raises:
        InputError: the file is not audio soundfile reads, the folder has no feature extractor, or the
            audio's sample rate is not the one the extractor takes.
    """
    import transformers

    mono, rate = samples(audio)
    try:
        extractor = transformers.AutoFeatureExtractor.from_pretrained(str(folder), local_files_only=True,
                                                                      trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise InputError(f"model folder {folder}: no feature extractor transformers loads ({first_line(exc)}); give the "
                         "folder the model was saved in with its preprocessor_config.json") from None
    if rate != extractor.sampling_rate:
        raise InputError(f"{audio} is sampled at {rate} Hz and the model's feature extractor takes "
                         f"{extractor.sampling_rate} Hz: resample it first")
    whole = {} if pad_to_frames is None else {"padding": True, "truncation": False,
                                              "pad_to_multiple_of": pad_to_frames * int(extractor.hop_length)}
    made = extractor(mono, sampling_rate=rate, return_tensors="pt", **whole)
    return made["input_features"].float()


def text(ids: Sequence[int], folder: str | Path) -> str | None:
    """`ids` as text by the tokenizer of the model `folder`; None where the folder has none."""
    import transformers

    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), local_files_only=True,
                                                               trust_remote_code=False)
    except (OSError, ValueError, TypeError):
        return None
    return str(tokenizer.decode(list(ids), skip_special_tokens=True))
