"""Greedy generation with a decoder program: `prefill` on the prompt, then one `decode` call per
new token, everything on the program's device. Both methods take tokens and the position of the
first (`pipeline.models.hf.Decoder.step`). The next token is the argmax of the last logits, computed
on the device into decode's own input memory; its position is kept there too; the token is read
back once per step (the caller gets the tokens as they come, and that read is the only host sync a
step has). With the runtime's `method_graph` option a decode step is one graph launch.

The program says how many positions its KV cache holds (its constant method `max_cache_len`,
which `pipeline.models.hf.decoder` programs carry): a prompt or a generation that would not fit is
refused before anything runs, never wrapped around or written past the cache's end."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch

from pipeline.errors import InputError
from pipeline.runtime.program import Program

CAPACITY_METHOD = "max_cache_len"
PLACEHOLDER_METHOD = "placeholder_token_id"  # a multimodal program's image or audio token (pipeline.runtime.media)


def capacity(program: Program) -> int:
    """Positions the program's KV cache holds (its `max_cache_len` constant method)."""
    if CAPACITY_METHOD not in program.constant_names:
        raise InputError(f"the program has no {CAPACITY_METHOD!r} constant method, so its cache size is unknown; "
                         "build it from a decoder whose model declares it (pipeline.models.hf.decoder does)")
    return int(program.constant(CAPACITY_METHOD))


def generate(program: Program, prompt: torch.Tensor, max_new_tokens: int, prefill: str = "prefill",
             decode: str = "decode") -> torch.Tensor:
    """The prompt followed by `max_new_tokens` greedily chosen tokens, shape [1, T + max_new_tokens].

    Raises:
        InputError: the prompt is not one row of token ids, or the prompt and the new tokens would
            not fit the cache (checked before anything runs).
    """
    new = list(stream(program, prompt, max_new_tokens, prefill, decode))
    return torch.cat([prompt.cpu(), torch.tensor([new], dtype=prompt.dtype)], dim=1)


def stream(program: Program, prompt: torch.Tensor, max_new_tokens: int, prefill: str = "prefill",
           decode: str = "decode", media_ran: bool = False) -> Iterator[int]:
    """The new tokens one at a time, as `generate` chooses them (checks first, as it does). A prompt
    holding a multimodal program's placeholder token is refused unless its encoder ran for it
    (`media_ran`: `pipeline.runtime.media` runs it), or the placeholders would read rows of no item's."""
    if prompt.dim() != 2 or prompt.shape[0] != 1 or prompt.dtype not in (torch.int32, torch.int64):
        raise InputError(f"prompt must be one row of token ids, shape [1, T], int64; got {tuple(prompt.shape)} {prompt.dtype}")
    if not media_ran and PLACEHOLDER_METHOD in program.constant_names:
        placeholder = int(program.constant(PLACEHOLDER_METHOD))
        if bool((prompt == placeholder).any()):
            raise InputError(f"the prompt holds the program's image or audio placeholder token ({placeholder}); run it with "
                             "pipeline.runtime.media, which runs the encoder for the image or audio first")
    if max_new_tokens < 1:
        raise InputError(f"max_new_tokens = {max_new_tokens} must be at least 1")
    length, room = prompt.shape[1], capacity(program)
    # Every token but the last generated one is written to the cache: T + N - 1 positions.
    if length + max_new_tokens - 1 > room:
        raise InputError(f"a prompt of {length} tokens and {max_new_tokens} new ones need {length + max_new_tokens - 1} "
                         f"cache positions; the program's cache holds {room} (shorten the prompt or generate fewer)")
    return _steps(program, prompt, max_new_tokens, prefill, decode)


def _steps(program: Program, prompt: torch.Tensor, max_new_tokens: int, prefill: str, decode: str) -> Iterator[int]:
    device = program.device
    first, step = program.method(prefill), program.method(decode)
    for method in (first, step):
        if len(method.inputs) != 2:
            raise InputError(f"method {method.name!r} takes {len(method.inputs)} inputs; generate calls prefill and decode "
                             "with tokens and the position of the first (rebuild with the current decoder configs)")
    # The next token and its position live where decode reads them, so a step copies nothing in.
    token = step.input_buffer(0, (1, 1))
    position = step.input_buffer(1, (1,))
    token = torch.empty((1, 1), dtype=torch.int64, device=device) if token is None else token
    position = torch.empty((1,), dtype=torch.int64, device=device) if position is None else position
    stream = torch.cuda.stream(program.stream) if program.stream is not None else contextlib.nullcontext()
    with torch.no_grad(), stream:  # on the program's stream: no cross-stream waits per call
        start = torch.zeros(1, dtype=torch.int64, device=device)
        logits = first.execute([prompt.to(device=device, dtype=torch.int64), start], copy_outputs=False)[0]
        token.resize_((1, 1))  # one method for both: its prompt took the token's memory, in the prompt's shape
        torch.argmax(logits[:, -1], dim=-1, keepdim=True, out=token)
        position.fill_(prompt.shape[1])
        for i in range(max_new_tokens):
            yield int(token.item())
            if i + 1 == max_new_tokens:
                return
            logits = step.execute([token, position], copy_outputs=False)[0]
            torch.argmax(logits[:, -1], dim=-1, keepdim=True, out=token)
            position += 1


def parse_prompt(text: str) -> torch.Tensor:
    """Token ids written in ASCII digits, separated by spaces, as a [1, T] int64 tensor (the program
    checks each id against its vocabulary when it runs).

    Raises:
        InputError: anything else (signs, other scripts' digits, an id past int64, no ids).
    """
    words = text.split()
    if not words or not all(re.fullmatch(r"[0-9]{1,18}", w) for w in words):
        raise InputError(f"--prompt-ids must be token ids in ASCII digits separated by spaces, e.g. \"1 5 9\"; got {text!r}")
    return torch.tensor([[int(w) for w in words]], dtype=torch.int64)


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.runtime.generate PROGRAM.pte --prompt "Once upon a time" --max-new-tokens 16`:
    encodes the prompt with the tokenizer the program carries (`pipeline.runtime.tokenizer`), prints the
    text as it comes and stops at an end-of-sequence token; with `--prompt-ids "1 5 9"` it takes
    and prints token ids. Then the seconds per token."""
    import argparse
    import time

    from pipeline.cli import reported
    from pipeline.runtime import tokenizer
    from pipeline.runtime.executors import EXECUTORS, describe, load_with

    parser = argparse.ArgumentParser(prog="python -m pipeline.runtime.generate", description=main.__doc__)
    parser.add_argument("pte", help="a decoder program (prefill and decode methods, max_cache_len)")
    parser.add_argument("--ptd", default=None, help="its .ptd, when its data is external")
    prompt_arg = parser.add_mutually_exclusive_group(required=True)
    prompt_arg.add_argument("--prompt", help="text, encoded with the program's own tokenizer")
    prompt_arg.add_argument("--prompt-ids", help="token ids, space-separated (printed back as ids)")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--runtime", choices=EXECUTORS, default="pipeline",
                        help="pipeline.runtime, or ExecuTorch's runtime with the native TensorRT delegate")
    args = parser.parse_args(argv)
    with reported():
        if args.prompt is not None:
            try:
                args.prompt.encode()
            except UnicodeEncodeError:  # bytes the terminal's encoding does not decode
                raise InputError("--prompt is not UTF-8 text; give the prompt in UTF-8 (or --prompt-ids)") from None
        program = load_with(args.runtime, args.pte, args.ptd)
        if args.prompt is not None:
            text = tokenizer.of_program(program)
            ids = text.encode(args.prompt)
            if not ids:
                raise InputError("--prompt encodes to no tokens; give some text")
            prompt = torch.tensor([ids], dtype=torch.int64)
        else:
            prompt = parse_prompt(args.prompt_ids)
        start = time.perf_counter()
        count = 0
        tokens = stream(program, prompt, args.max_new_tokens)

        def counted() -> Iterator[int]:
            nonlocal count
            for token in tokens:
                count += 1
                yield token

        pieces = text.stream(counted()) if args.prompt is not None else (f"{t} " for t in counted())
        for piece in pieces:
            print(piece, end="", flush=True)
        seconds = time.perf_counter() - start
    print(f"\n{count} tokens in {seconds:.3f} s ({describe(program)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
