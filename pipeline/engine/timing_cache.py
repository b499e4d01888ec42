"""The timing cache file (`compile.timing_cache_path`): read before each build and replaced after it,
and only ever a file TensorRT wrote (`files.read_cache`: a path holding a user's file, a link or a
pipe is refused before the build and again before the write). TensorRT's serialized timing cache
begins with `MAGIC`."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import CompileSpecError
from pipeline.files import read_cache, write_cache

KEY = "compile.timing_cache_path"
MAGIC = b"ptrt"
LIMIT = 1 << 30  # bytes


def check(path: str | Path) -> bytes:
    """The timing cache at `path` (b"" where there is none yet); CompileSpecError for anything else."""
    return read_cache(path, KEY, MAGIC, LIMIT, CompileSpecError)


def write(path: str | Path, data: bytes) -> None:
    write_cache(path, data, KEY, MAGIC, LIMIT, CompileSpecError)
