"""Greedy transcription: Whisper programs (`transcribe`), transducer programs
(`transcribe_transducer`) and CTC programs (`transcribe_ctc`, below). A Whisper program (`pipeline.models.whisper`) runs `encoder` once on the
utterance's log-mel features (it writes the cross-attention keys and values into the program's state),
then `text_decoder` on the prompt (the decoder start token, or the tokens the caller gives: language,
task, ...) and once per new token, choosing each as `transformers`' Whisper `generate` does greedily:
the argmax of the last logits, never one of `suppress_tokens`, nor first one of
`begin_suppress_tokens`; it stops after the end-of-transcript token or when the cache is full.

    python -m pipeline.runtime.speech PROGRAM.pte --audio speech.wav --model-folder FOLDER [--ptd PROGRAM.ptd]
    python -m pipeline.runtime.speech PROGRAM.pte --features features.npy [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import io
import json
from collections.abc import Sequence
from typing import Any

import torch

from pipeline.errors import InputError
from pipeline.files import read_regular
from pipeline.runtime.generate import capacity

FEATURES_LIMIT = 1 << 30  # bytes of a features file

SUPPRESS_METHOD = "whisper_suppress_tokens"  # the constant method with both lists (JSON)
CTC_BLANK = "ctc_blank_id"  # the constant method a CTC program carries its blank's id in


def transcribe(program: Any, features: torch.Tensor, prompt: Sequence[int] | None = None,
               max_new_tokens: int | None = None) -> list[int]:
    """The token ids a Whisper program transcribes `features` [1, mels, frames] to (the prompt left out,
    the end-of-transcript token kept where it came). `program`: a loaded program (`pipeline.runtime.load`,
    or ExecuTorch's runtime through `pipeline.runtime.executorch_runtime.load`).

    Raises:
        InputError: the program is not a Whisper program, or the prompt and `max_new_tokens` would
            not fit its cache (checked before anything runs).
    """
    for name in ("decoder_start_token_id", "eos_token_id", SUPPRESS_METHOD):
        if name not in program.constant_names:
            raise InputError(f"the program has no {name!r} constant method: it is not a Whisper program "
                             "(build one with pipeline.models.whisper.whisper)")
    tokens = list(prompt) if prompt else [int(program.constant("decoder_start_token_id"))]
    positions = capacity(program)
    room = positions - len(tokens)
    steps = room if max_new_tokens is None else int(max_new_tokens)
    if steps < 1 or steps > room:
        raise InputError(f"a prompt of {len(tokens)} tokens and {steps} new ones do not fit the program's cache of "
                         f"{positions} positions; ask for 1..{room} new tokens")
    eos = int(program.constant("eos_token_id"))
    suppress = json.loads(program.constant(SUPPRESS_METHOD))
    encoder, decoder = program.method("encoder"), program.method("text_decoder")
    device = getattr(program, "device", torch.device("cpu"))
    encoder.execute([features.to(device)])
    out: list[int] = []
    logits = decoder.execute([torch.tensor([tokens], device=device), torch.tensor([0], device=device)])[0]
    vocab = logits.shape[-1]  # a token id past the vocabulary suppresses nothing, as in transformers
    never, not_first = ([t for t in suppress[key] if 0 <= t < vocab] for key in ("suppress_tokens", "begin_suppress_tokens"))
    while True:
        last = logits[0, -1].float().clone()
        last[never] = -torch.inf
        if not out:
            last[not_first] = -torch.inf
        token = int(last.argmax())
        out.append(token)
        if token == eos or len(out) == steps:
            return out
        position = len(tokens) + len(out) - 1
        logits = decoder.execute([torch.tensor([[token]], device=device), torch.tensor([position], device=device)])[0]


def transcribe_transducer(program: Any, features: torch.Tensor, max_symbols_per_frame: int | None = None) -> list[int]:
    """The token ids a transducer program (`pipeline.models.transducer`, Parakeet's RNN-T and TDT from
    `pipeline.models.parakeet`) transcribes `features` to, greedily: `encoder` once (a Parakeet encoder on
    the features padded to its frames, with their mask, keeping its frames in the program's state, where
    `joint` reads them by index), the prediction network started on the blank (or the program's `decoder_start_id`),
    then the joint's argmax on the current frame and the last prediction: a token is emitted and advances
    the prediction network; RNN-T moves to the next frame on the blank or after `max_symbols_per_frame`
    tokens at one frame (the program's `max_symbols_per_step`, else 10); TDT moves by the duration the
    joint predicts (at least one frame on the blank). A program that carries `max_symbols_per_step` stops,
    as transformers' `generate` does, after that many steps per frame of the utterance, less one.

    Raises:
        InputError: the program is not a transducer program.
    """
    names = program.constant_names
    if "blank_id" not in names:
        raise InputError("the program has no 'blank_id' constant method: it is not a transducer program "
                         "(build one with pipeline.models.transducer.transducer)")
    if max_symbols_per_frame is not None:
        limit = max_symbols_per_frame
    else:
        limit = int(program.constant("max_symbols_per_step")) if "max_symbols_per_step" in names else 10
    if limit < 1:
        raise InputError(f"max_symbols_per_frame = {limit}: a frame may emit at least 1 token")
    blank = int(program.constant("blank_id"))
    durations = json.loads(program.constant("tdt_durations")) if "tdt_durations" in names else None
    vocab = int(program.constant("tdt_vocab_size")) if durations is not None else None
    encoder, step, joint = (program.method(name) for name in ("encoder", "decoder_step", "joint"))
    device = getattr(program, "device", torch.device("cpu"))
    in_state = len(joint.inputs) == 1  # Parakeet: the frames and the prediction stay in the program's state
    if in_state:  # features padded to the program's frames, and their mask
        (valid,) = encoder.execute(_padded(encoder, features, device))
        count, frames = int(valid.sum()), None
    else:
        (frames,) = encoder.execute([features.to(device)])
        count, frames = frames.shape[1], frames.clone()  # the method's own memory is reused by later calls
    cap = limit * count - 1 if "max_symbols_per_step" in names else None
    start = int(program.constant("decoder_start_id")) if "decoder_start_id" in names else blank
    prediction = step.execute([torch.tensor([start], device=device)])[0].clone()
    out: list[int] = []
    t = symbols = steps = 0
    while t < count and (cap is None or steps < cap):
        call = [torch.tensor([t], device=device)] if frames is None else [frames[:, t].contiguous(), prediction]
        logits = joint.execute(call)[0][0]
        steps += 1
        token = int(logits[:vocab].argmax())
        if token != blank:
            out.append(token)
            prediction = step.execute([torch.tensor([token], device=device)])[0].clone()
        if durations is not None:
            t += max(durations[int(logits[vocab:].argmax())], int(token == blank))
        elif token == blank or symbols + 1 >= limit:
            t, symbols = t + 1, 0
        else:
            symbols += 1
    return out


def _padded(encoder: Any, features: torch.Tensor, device: torch.device) -> list[torch.Tensor]:
    """`features` [1, frames, mels] padded to the frames `encoder` takes, and the mask of the utterance's.

    Raises:
        InputError: not one utterance, or longer than the program's frames.
    """
    spec = encoder.inputs[0]  # pipeline.runtime's TensorInfo (its planned shape), or ExecuTorch's runtime's TensorSpec
    frames = int((getattr(spec, "max", None) or spec.shape)[1])
    if features.dim() != 3 or features.shape[0] != 1 or not 1 <= features.shape[1] <= frames:
        raise InputError(f"features of shape {list(features.shape)}: the program takes one utterance [1, frames, mels] "
                         f"of 1..{frames} frames; build it with longer inputs (model.methods.encoder.inputs) for more")
    padded = torch.zeros(1, frames, features.shape[2], dtype=features.dtype)
    padded[:, :features.shape[1]] = features
    mask = torch.zeros(1, frames, dtype=torch.int64)
    mask[:, :features.shape[1]] = 1
    return [padded.to(device), mask.to(device)]


def transcribe_ctc(program: Any, features: torch.Tensor) -> list[int]:
    """The token ids a CTC program (`pipeline.models.parakeet`) transcribes `features` [1, frames, mels]
    to, greedily: `encoder` once on them padded to its frames (with the mask saying which are the
    utterance's), the argmax of each encoder frame, the padding's frames taken as blank, runs of one
    id merged and the blank dropped, as transformers' `generate` and tokenizer do.

    Raises:
        InputError: the program is not a CTC program, or the utterance is longer than its frames.
    """
    if CTC_BLANK not in program.constant_names:
        raise InputError(f"the program has no {CTC_BLANK!r} constant method: it is not a CTC program "
                         "(build one with pipeline.models.parakeet.parakeet)")
    blank = int(program.constant(CTC_BLANK))
    encoder = program.method("encoder")
    device = getattr(program, "device", torch.device("cpu"))
    logits, valid = encoder.execute(_padded(encoder, features, device))
    best = logits[0].argmax(-1).masked_fill(valid[0] == 0, blank).tolist()
    return [t for i, t in enumerate(best) if t != blank and (i == 0 or t != best[i - 1])]


def main(argv: Sequence[str] | None = None) -> None:
    """Transcribe an audio file (with the model folder's feature extractor) or a `.npy` of log-mel
    features; print the token ids, and their text where the folder has a tokenizer."""
    import numpy as np

    from pipeline.cli import reported
    from pipeline.runtime import audio, load

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pte")
    parser.add_argument("--ptd", default=None)
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--audio", help="an audio file (WAV, FLAC, OGG); needs --model-folder")
    given.add_argument("--features", help=".npy of log-mel features as the model's feature extractor makes them "
                                          "(Whisper and transducers [1, mels, frames], Parakeet [1, frames, mels]), float32")
    parser.add_argument("--model-folder", help="the model folder the program was built from: its feature extractor "
                                               "and tokenizer")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="Whisper: at most this many tokens")
    args = parser.parse_args(argv)
    with reported():
        if args.audio is not None:
            if args.model_folder is None:
                raise InputError("--audio needs --model-folder: the folder whose feature extractor makes its features")
            features = audio.features(args.audio, args.model_folder)
        else:
            data = read_regular(args.features, "--features", FEATURES_LIMIT, InputError)
            try:
                array = np.load(io.BytesIO(data), allow_pickle=False)
            except (ValueError, OSError, EOFError) as exc:  # not NumPy's (a pickle is never loaded)
                raise InputError(f"{args.features} is not a .npy array of log-mel features ({exc})") from None
            if not isinstance(array, np.ndarray) or array.dtype.kind != "f":
                raise InputError(f"{args.features} is not a .npy array of float log-mel features (an .npz archive or "
                                 "another kind); save one array with numpy.save")
            features = torch.from_numpy(array)
        program = load(args.pte, args.ptd)
        if CTC_BLANK in program.constant_names:
            tokens = transcribe_ctc(program, features)
        elif "blank_id" in program.constant_names:
            tokens = transcribe_transducer(program, features)
        else:
            tokens = transcribe(program, features, max_new_tokens=args.max_new_tokens)
        print(" ".join(map(str, tokens)))
        said = audio.text(tokens, args.model_folder) if args.model_folder else None
        if said is not None:
            print(said)


if __name__ == "__main__":
    main()
