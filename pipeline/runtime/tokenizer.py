"""The tokenizer a decoder program carries, and the one place that writes and reads it.

A decoder built from a Hugging Face model folder with a `tokenizer.json` (a fast tokenizer, as
`save_pretrained` writes it) stores it in its program as the constant method `pipeline_tokenizer`:
one JSON string

    {"tokenizer": "<tokenizer.json's text>", "sha256": "<its SHA-256>", "eos_token_ids": [ids]}

(`eos_token_ids` from the folder's `generation_config.json`, else its `config.json`; none: []).
`pipeline.runtime.generate` encodes a text prompt and decodes the tokens with it, so a program and
its tokenizer travel as one file and cannot be paired wrongly. It is read with the `tokenizers`
library from the stored text: local data only, no code.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, InputError
from pipeline.files import read_regular

METHOD = "pipeline_tokenizer"
FILE = "tokenizer.json"
LIMIT = 1 << 30  # bytes of a tokenizer or config file
_OTHER_FILES = ("tokenizer.model", "vocab.json", "vocab.txt", "spiece.model", "tokenizer_config.json")


@dataclass(frozen=True)
class ProgramTokenizer:
    """A program's tokenizer: text to token ids and back, and the ids that end a sequence."""

    tokenizer: Any  # tokenizers.Tokenizer
    eos_token_ids: tuple[int, ...]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def stream(self, tokens: Iterator[int]) -> Iterator[str]:
        """The text of `tokens` piece by piece as they come (a piece is held back while it ends
        inside a character that later tokens complete); stops at an end-of-sequence token."""
        ids: list[int] = []
        shown = ""
        for token in tokens:
            if token in self.eos_token_ids:
                return
            ids.append(token)
            text = self.decode(ids)
            if text.endswith("\ufffd"):
                continue
            if text.startswith(shown):
                yield text[len(shown):]
            shown = text


def from_folder(folder: str | Path) -> str | None:
    """The `pipeline_tokenizer` value for a model folder, or None when it has no tokenizer at all.

    Raises:
        ConfigError: the folder has tokenizer files but no `tokenizer.json`, or one that the
            `tokenizers` library cannot read.
    """
    where = Path(folder)
    path = where / FILE
    if not path.exists() and not path.is_symlink():
        others = [n for n in _OTHER_FILES if (where / n).exists()]
        if others:
            raise ConfigError(f"model folder {str(folder)!r} has {', '.join(others)} but no {FILE}; save its tokenizer "
                              "with transformers' tokenizer.save_pretrained (a fast tokenizer writes tokenizer.json)")
        return None
    if path.is_symlink():
        raise ConfigError(f"{path} is a symbolic link; the tokenizer is read from the folder itself (copy the file)")
    try:
        text = read_regular(path, "the model folder's tokenizer", LIMIT).decode()
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text; save the tokenizer with transformers' tokenizer.save_pretrained") from None
    _parse(text, str(path))
    return json.dumps({"tokenizer": text, "sha256": hashlib.sha256(text.encode()).hexdigest(),
                       "eos_token_ids": _eos_ids(where)}, separators=(",", ":"))


def _eos_ids(folder: Path) -> list[int]:
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if path.is_file():
            try:
                value = json.loads(read_regular(path, f"the model folder's {name}", LIMIT)).get("eos_token_id")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
                raise ConfigError(f"{path} is not a JSON object; save the model with save_pretrained") from None
            if value is not None:
                return [int(v) for v in (value if isinstance(value, list) else [value])]
    return []


def of_program(program: Any) -> ProgramTokenizer:
    """The tokenizer a loaded program carries (`program.constant(METHOD)`).

    Raises:
        InputError: the program carries none.
    """
    if METHOD not in program.constant_names:
        raise InputError("the program carries no tokenizer (build it from a Hugging Face model folder with a tokenizer.json, "
                         "model.weights=<folder>), so a text --prompt cannot be encoded; pass token ids with --prompt-ids")
    stored = json.loads(str(program.constant(METHOD)))
    if hashlib.sha256(stored["tokenizer"].encode()).hexdigest() != stored["sha256"]:
        raise InputError("the program's tokenizer does not match the digest stored with it (corrupt program); rebuild it")
    return ProgramTokenizer(_parse(stored["tokenizer"], "the program's tokenizer"), tuple(stored["eos_token_ids"]))


def _parse(text: str, where: str) -> Any:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_str(text)
    except Exception as exc:  # the tokenizers library raises its own Exception subclass for any bad file
        raise ConfigError(f"{where} is not a tokenizer the tokenizers library reads ({str(exc)[:200]}); save it with "
                          "transformers' tokenizer.save_pretrained") from exc
