"""TensorRT's cache files at a user's path: the timing cache (`compile.timing_cache_path`, read before
each build and replaced after it) and TensorRT-RTX's runtime cache (`runtime.runtime_cache_path`, read
when the first engine starts and replaced at exit). Only ever a file TensorRT wrote is replaced
(`files.read_cache`): a path holding a user's file, a link or a pipe is refused before the work and
again before the write. TensorRT serializes both caches beginning with `MAGIC` (the runtime cache
seen on an H100, 2026-12-07, results/gpu-log.md)."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import CompileSpecError, RuntimeUnavailableError
from pipeline.files import read_cache, write_cache

MAGIC = b"ptrt"
LIMIT = 1 << 32  # bytes
TIMING = "compile.timing_cache_path"
RUNTIME = "runtime.runtime_cache_path"
_ERRORS: dict[str, type[Exception]] = {TIMING: CompileSpecError, RUNTIME: RuntimeUnavailableError}


def check(path: str | Path, key: str = TIMING) -> bytes:
    """The cache of `key` at `path` (b"" where there is none yet); the key's error for anything else."""
    return read_cache(path, key, MAGIC, LIMIT, _ERRORS[key])


def write(path: str | Path, data: bytes, key: str = TIMING) -> None:
    write_cache(path, data, key, MAGIC, LIMIT, _ERRORS[key])
