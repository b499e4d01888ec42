"""The files a `model.weights` path names (`weight_files`) and their digests (`digests`), found without
reading any tensor (no torch: the DVC stage that records them runs on every `dvc repro`).

A path names one of: a safetensors file (`*.safetensors`); a sharded safetensors checkpoint, its index
(`*.safetensors.index.json`, `weight_map`: key -> shard file in the index's folder); a PyTorch checkpoint
(`*.pt`, `*.pth`, `*.bin`, `*.ckpt`); a Hugging Face model folder (`config.json` beside its
safetensors, single or sharded). Every file is a regular file (a symbolic link is refused: what it points
to can change under a cached build; a pipe or device would block the reader), and a shard inside its
index's folder. `checkpoint.py` reads them."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError

SAFETENSORS = ".safetensors"
INDEX = ".safetensors.index.json"
PICKLED = (".pt", ".pth", ".bin", ".ckpt")
HF_CONFIG = "config.json"


def is_model_folder(path: str | Path) -> bool:
    """Whether `path` is a Hugging Face model folder (a `config.json` in it)."""
    return Path(path).is_dir() and (Path(path) / HF_CONFIG).is_file()


def weight_files(path: str | Path) -> list[Path]:
    """The files a checkpoint path reads, in order: the file itself, an index and its shards, or a
    model folder's `config.json` and weights (its tokenizer files are read by `tokenizer.py`).

    Raises:
        ConfigError: the path is missing, a link, of no known format, or an index names a file
            outside its folder or a shard that is not there.
    """
    where = Path(path)
    regular_file(where, "model.weights", folder=True)
    if where.is_dir():
        if not is_model_folder(where):
            raise ConfigError(f"model.weights = {str(path)!r} is a folder without {HF_CONFIG}; name a weight file "
                              f"(*{SAFETENSORS}, *{INDEX}, {', '.join('*' + s for s in PICKLED)}) or a Hugging Face model folder")
        inside = [where / n for n in ("model" + INDEX, "model" + SAFETENSORS) if (where / n).exists()]
        if not inside:
            raise ConfigError(f"model folder {str(path)!r} has no model{SAFETENSORS} or model{INDEX}; save it with "
                              "transformers' save_pretrained (safetensors; pickled pytorch_model.bin is not read)")
        regular_file(where / HF_CONFIG, f"the model folder's {HF_CONFIG}")
        return [where / HF_CONFIG, *weight_files(inside[0])]
    name = where.name.lower()
    if name.endswith(INDEX):
        return [where, *_shards(where)]
    if name.endswith(SAFETENSORS) or name.endswith(PICKLED):
        return [where]
    raise ConfigError(f"model.weights = {str(path)!r} is not a weight file this pipeline reads: name a *{SAFETENSORS}, a "
                      f"*{INDEX}, a PyTorch checkpoint ({', '.join('*' + s for s in PICKLED)}) or a Hugging Face model folder")


def regular_file(path: Path, what: str, folder: bool = False) -> None:
    """Refuse a path the build would read that is a link, missing, or neither a regular file nor (with
    `folder`) a folder: a pipe or device would block the reader or never end.

    Raises:
        ConfigError: naming `what`, the path and the fix.
    """
    if path.is_symlink():
        raise ConfigError(f"{what} = {str(path)!r} is a symbolic link; name the file itself (a link can point elsewhere "
                          "after the build; with DVC, use a copy or reflink cache: `dvc config cache.type reflink,copy`)")
    if not path.exists():
        raise ConfigError(f"{what} = {str(path)!r} does not exist; name {'a weight file or model folder' if folder else 'a file'}"
                          " (paths are relative to the directory the build runs in)")
    if not path.is_file() and not (folder and path.is_dir()):
        raise ConfigError(f"{what} = {str(path)!r} is not a regular file (a pipe, socket or device); name "
                          f"{'a weight file or model folder' if folder else 'a file'}")


def _shards(index: Path) -> list[Path]:
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"{index} is not a safetensors index (JSON with a 'weight_map' of key -> shard file): "
                          f"{type(exc).__name__}: {exc}; write it with transformers' save_pretrained") from exc
    folder = index.parent.resolve()
    out = []
    for name in names:
        shard = index.parent / str(name)
        if Path(str(name)).is_absolute() or ".." in Path(str(name)).parts or shard.resolve().parent != folder:
            raise ConfigError(f"{index} names shard {name!r}, which is not a file in the index's own folder; an index "
                              "names its shards by file name only")
        regular_file(shard, f"the shard {index.name} names")
        out.append(shard)
    return out


def digests(path: str | Path) -> list[dict[str, Any]]:
    """File name (relative to the path's folder), bytes and SHA-256 of every file `path` reads."""
    base = Path(path) if Path(path).is_dir() else Path(path).parent
    out = []
    for file in weight_files(path):
        digest = hashlib.sha256()
        with open(file, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 22), b""):
                digest.update(chunk)
        out.append({"file": file.relative_to(base).as_posix(), "bytes": file.stat().st_size, "sha256": digest.hexdigest()})
    return out
