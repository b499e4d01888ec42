"""Generation with a program that reads images or audio (`pipeline.models.multimodal`): its encoder
method runs once per image or 30 s window, writing that item's rows into the program's state at the
item's slot; then its text decoder generates greedily (`pipeline.runtime.generate`) from a prompt that
holds the model's placeholder token once per row, as the folder's processor writes it. Everything is
checked before the first method runs, so a refused call leaves the program's state as it was.

    python -m pipeline.runtime.media PROGRAM.pte --image photo.png --prompt "What is in it?" --model-folder FOLDER
    python -m pipeline.runtime.media PROGRAM.pte --image wide.png --pan-and-scan --prompt "..." --model-folder FOLDER
    python -m pipeline.runtime.media PROGRAM.pte --audio speech.wav --prompt "What is said?" --model-folder FOLDER
    python -m pipeline.runtime.media PROGRAM.pte --audio speech.wav --transcribe --language en --model-folder FOLDER
    python -m pipeline.runtime.media PROGRAM.pte --audio speech.wav --prompt-ids "1 24 24 ..." --model-folder FOLDER
"""

from __future__ import annotations

import io
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from pipeline.errors import InputError, first_line
from pipeline.files import read_regular
from pipeline.runtime.generate import PLACEHOLDER_METHOD as PLACEHOLDER
from pipeline.runtime.generate import stream

# The constant methods of a multimodal program (besides its placeholder token, `PLACEHOLDER`): the rows
# one image or window stands for, how many items its state holds, and (audio) the frames of one window.
ROWS, SLOTS, FRAMES = "media_rows", "media_slots", "audio_frames"
ENCODERS = {"image": "vision_encoder", "audio": "audio_encoder"}  # what a program reads -> its encoder method
TEXT_DECODER = "text_decoder"
IMAGE_LIMIT = 1 << 28  # bytes of an image file


def media_of(program: Any) -> str:
    """What the program reads ("image" or "audio").

    Raises:
        InputError: it is not a program of `pipeline.models.multimodal`.
    """
    kinds = [media for media, method in ENCODERS.items() if method in program.method_names]
    if len(kinds) != 1 or not {PLACEHOLDER, ROWS, SLOTS} <= set(program.constant_names):
        raise InputError("the program reads no images or audio (no vision_encoder or audio_encoder method and its "
                         "constants); build one with model=image_text_decoder or model=audio_text_decoder")
    return kinds[0]


def media_stream(program: Any, prompt: torch.Tensor, media: Sequence[torch.Tensor], max_new_tokens: int) -> Iterator[int]:
    """The new tokens one at a time: each item of `media` (as the encoder method takes it, [1, ...]) run
    by the encoder into its slot, then the prompt and the tokens chosen after it greedily.

    Raises:
        InputError: more items than the program has slots, items of different shapes, a prompt whose
            placeholders are not one per row of the items, or a prompt `generate` refuses (all checked
            before anything runs, the first item's shape by the encoder's own check).
    """
    kind = media_of(program)
    placeholder, rows, slots = (int(program.constant(name)) for name in (PLACEHOLDER, ROWS, SLOTS))
    if len(media) > slots:
        raise InputError(f"{len(media)} {kind} items given; the program holds {slots} (model.kwargs.slots): give fewer "
                         "or build it with more slots")
    if any(tuple(item.shape) != tuple(media[0].shape) or item.dtype != media[0].dtype for item in media):
        raise InputError(f"the {kind} items are of shapes {[list(item.shape) for item in media]}; the encoder takes one "
                         "shape: make each with the model's processor")  # else a later item's refusal would follow a run
    found = int((prompt == placeholder).sum())
    if found != rows * len(media):
        raise InputError(f"the prompt holds {found} placeholder tokens (id {placeholder}); {len(media)} {kind} item(s) of "
                         f"{rows} rows each need {rows * len(media)}: make the prompt with the model's processor, which "
                         "writes one per row")
    steps = stream(program, prompt, max_new_tokens, TEXT_DECODER, TEXT_DECODER, media_ran=True)  # checks the prompt, the cache
    encoder = program.method(ENCODERS[kind])
    device = getattr(program, "device", torch.device("cpu"))
    with torch.no_grad():
        for slot, item in enumerate(media):
            encoder.execute([item.to(device), torch.tensor([slot], dtype=torch.int64, device=device)])
    return steps


def media_generate(program: Any, prompt: torch.Tensor, media: Sequence[torch.Tensor], max_new_tokens: int) -> torch.Tensor:
    """The prompt followed by `max_new_tokens` greedily chosen tokens, as `media_stream` chooses them."""
    new = list(media_stream(program, prompt, media, max_new_tokens))
    return torch.cat([prompt.cpu(), torch.tensor([new], dtype=prompt.dtype)], dim=1)


def image_inputs(image: str | Path, folder: str | Path, prompt: str | None,
                 pan_and_scan: bool = False) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The prompt's ids (None without a text prompt) and the image's pixels [items, 3, H, W], made by the
    processor of the model `folder` from an image file Pillow reads: one item, or with `pan_and_scan`
    (Gemma 3) the image and the crops the processor cuts from it, each an item with its own placeholders.
    A text prompt goes through the folder's chat template where it has one (the image first), else
    follows the image's token.

    Raises:
        InputError: the file is not an image Pillow reads, the folder has no processor transformers
            loads, or `pan_and_scan` and its image processor cuts no crops.
    """
    from PIL import Image, UnidentifiedImageError

    data = read_regular(image, "--image", IMAGE_LIMIT, InputError)
    try:
        picture = Image.open(io.BytesIO(data)).convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise InputError(f"{image} is not an image Pillow reads ({first_line(exc)}); give a PNG, JPEG or WebP file") from None
    processor = _processor(folder)
    crops = {}
    if pan_and_scan:
        images = getattr(processor, "image_processor", processor)
        if not hasattr(images, "do_pan_and_scan"):
            raise InputError(f"--pan-and-scan: the folder's {type(images).__name__} cuts no crops "
                             "(Gemma 3's does); leave it out")
        crops = {"do_pan_and_scan": True}  # the crops' sizes: the processor's own defaults, as transformers cuts them
    if prompt is None and not crops:
        return None, processor.image_processor(picture, return_tensors="pt")["pixel_values"]
    if prompt is not None and getattr(processor, "chat_template", None):
        turn = [{"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": prompt}]}]
        made = processor.apply_chat_template(turn, add_generation_prompt=True, tokenize=True, return_dict=True,
                                             return_tensors="pt", processor_kwargs=crops)
    else:
        text = processor.image_token if prompt is None else f"{processor.image_token} {prompt}"
        made = processor(images=[picture], text=text, return_tensors="pt", **crops)
    return (made["input_ids"] if prompt is not None else None), made["pixel_values"]


def audio_windows(audio: str | Path, folder: str | Path, frames: int) -> list[torch.Tensor]:
    """The log-mel features of an audio file (`pipeline.runtime.audio`) in windows of `frames` (the
    encoder's), the last one padded as the feature extractor pads."""
    from pipeline.runtime import audio as audio_files

    features = audio_files.features(audio, folder, pad_to_frames=frames)
    return list(features.split(frames, dim=-1))


def audio_inputs(audio: str | Path, folder: str | Path, frames: int, prompt: str | None = None,
                 language: str | None = None) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The prompt's ids and the audio's windows of `frames` (the encoder's), both made by the processor of
    the model `folder` (Voxtral's, with mistral-common's encoding; the audio padded to whole windows,
    never cut): a chat turn of the audio and the text `prompt`, or without one a transcription request
    (in `language`, an ISO 639-1 code; without one the model tells the language).

    Raises:
        InputError: the folder's processor makes no such prompt, mistral-common is not installed, or the
            processor refuses the audio (a sample rate it does not take, say).
    """
    import base64

    from pipeline.runtime import audio as audio_files

    processor = _processor(folder)
    extractor = getattr(processor, "feature_extractor", None)
    if extractor is None or not hasattr(processor, "apply_transcription_request"):
        raise InputError(f"--prompt or --transcribe with --audio: the folder's {type(processor).__name__} makes no prompt "
                         "of audio (Voxtral's does); give the prompt as ids (--prompt-ids), the placeholder once per row")
    window = {"max_source_positions": frames, "pad_to_multiple_of": frames * int(extractor.hop_length)}
    try:
        if prompt is None:
            mono, rate = audio_files.samples(audio)
            made = processor.apply_transcription_request(audio=[mono], model_id=str(folder), language=language,
                                                         sampling_rate=rate, format="WAV", audio_kwargs=window)
        else:
            data = read_regular(audio, "--audio", audio_files.AUDIO_LIMIT, InputError)
            turn = [{"role": "user", "content": [{"type": "audio", "base64": base64.b64encode(data).decode()},
                                                 {"type": "text", "text": prompt}]}]
            made = processor.apply_chat_template(turn, tokenize=True, return_dict=True, return_tensors="pt",
                                                 processor_kwargs={"audio_kwargs": window})
    except ImportError as exc:
        raise InputError(f"the folder's processor needs mistral-common ({first_line(exc)}): pip install "
                         "'mistral-common[audio]', or give --prompt-ids") from None
    except (ValueError, RuntimeError) as exc:
        raise InputError(f"{audio}: the folder's processor refused it ({first_line(exc)})") from None
    return made["input_ids"], list(made["input_features"].float().split(1))


def _processor(folder: str | Path) -> Any:
    import transformers

    try:
        return transformers.AutoProcessor.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError, TypeError, ImportError) as exc:
        raise InputError(f"model folder {folder}: no processor transformers loads ({first_line(exc)}); give the folder the "
                         "model was saved in with its processor files") from None


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.runtime.media PROGRAM.pte --image x.png --prompt "..." --model-folder F`: the
    folder's processor makes the image's pixels and the prompt's ids, the program generates greedily and
    the text is printed with the tokenizer it carries (else the folder's; ids where neither has one).
    `--audio x.wav`: the folder's processor makes its windows and the prompt's ids (Voxtral's:
    mistral-common's; with `--transcribe`, its transcription request), or with `--prompt-ids` (the
    placeholder once per row) its feature extractor makes the windows."""
    import argparse

    from pipeline.cli import reported
    from pipeline.runtime import audio as audio_files
    from pipeline.runtime import tokenizer
    from pipeline.runtime.executors import EXECUTORS, load_with
    from pipeline.runtime.generate import parse_prompt

    parser = argparse.ArgumentParser(prog="python -m pipeline.runtime.media", description=main.__doc__)
    parser.add_argument("pte", help="a program of model=image_text_decoder or model=audio_text_decoder")
    parser.add_argument("--ptd", default=None, help="its .ptd, when its data is external")
    item = parser.add_mutually_exclusive_group(required=True)
    item.add_argument("--image", help="an image file (PNG, JPEG, ...)")
    item.add_argument("--audio", help="an audio file (WAV, FLAC, OGG)")
    parser.add_argument("--pan-and-scan", action="store_true",
                        help="with --image (Gemma 3): the image and the crops the processor cuts from it, each an item")
    prompt_arg = parser.add_mutually_exclusive_group(required=True)
    prompt_arg.add_argument("--prompt", help="text, made into ids with the image or audio by the folder's processor")
    prompt_arg.add_argument("--prompt-ids", help="token ids, space-separated, the placeholder once per row")
    prompt_arg.add_argument("--transcribe", action="store_true",
                            help="with --audio (Voxtral): the folder's processor's transcription request")
    parser.add_argument("--language", default=None, help="with --transcribe: the audio's language (ISO 639-1, e.g. en)")
    parser.add_argument("--model-folder", required=True, help="the model folder the program was built from")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--runtime", choices=EXECUTORS, default="pipeline")
    args = parser.parse_args(argv)
    with reported():
        if args.audio is not None and args.pan_and_scan:
            raise InputError("--pan-and-scan crops images: leave it out with --audio")
        if args.image is not None and args.transcribe:
            raise InputError("--transcribe transcribes audio: give --audio, or --prompt with --image")
        if args.language is not None and not args.transcribe:
            raise InputError("--language is the language --transcribe asks for: give --transcribe too")
        program = load_with(args.runtime, args.pte, args.ptd)
        kind = media_of(program)
        if kind != ("image" if args.image is not None else "audio"):
            raise InputError(f"the program reads {kind}: give --{kind}")
        if args.image is not None:
            ids, pixels = image_inputs(args.image, args.model_folder, args.prompt, args.pan_and_scan)
            media = list(pixels.split(1))
        elif args.prompt_ids is None:
            ids, media = audio_inputs(args.audio, args.model_folder, int(program.constant(FRAMES)), args.prompt, args.language)
        else:
            ids = None
            media = audio_windows(args.audio, args.model_folder, int(program.constant(FRAMES)))
        prompt = ids if ids is not None else parse_prompt(args.prompt_ids)
        tokens = media_stream(program, prompt, media, args.max_new_tokens)
        if tokenizer.METHOD in program.constant_names:
            for piece in tokenizer.of_program(program).stream(tokens):
                print(piece, end="", flush=True)
        else:  # the folder's tokenizer where it has one (Voxtral's is mistral-common's), else the ids
            new = list(tokens)
            words = audio_files.text(new, args.model_folder)
            print(words if words is not None else " ".join(map(str, new)), end="")
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
