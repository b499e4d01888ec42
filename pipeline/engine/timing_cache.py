"""The timing cache file (`compile.timing_cache_path`): read before each build and written after it,
and only ever a file TensorRT wrote. A path that holds anything else (a user's file, a link, a pipe)
is refused before the build and again before the write, so a mistyped path never replaces a file the
project did not create. TensorRT's serialized timing cache begins with `MAGIC`."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.errors import CompileSpecError
from pipeline.files import read_regular, write_bytes

MAGIC = b"ptrt"
LIMIT = 1 << 30  # bytes


def check(path: str | Path) -> bytes:
    """The timing cache at `path` (b"" where there is none yet).

    Raises:
        CompileSpecError: the path is a link, not a regular file, too large, or a file TensorRT did not
            write.
    """
    where = Path(path)
    if where.is_symlink():
        raise CompileSpecError(f"compile.timing_cache_path = {str(path)!r} is a symbolic link; name the file itself")
    if not os.path.lexists(where):
        return b""
    data = read_regular(where, "compile.timing_cache_path", LIMIT, CompileSpecError)
    if not data.startswith(MAGIC):
        raise CompileSpecError(f"compile.timing_cache_path = {str(path)!r} holds a file that is not a TensorRT timing "
                               f"cache ({len(data)} bytes), which the build would replace; name a new path")
    return data


def write(path: str | Path, data: bytes) -> None:
    """Replace the timing cache at `path` with `data`, claimed first: what is there is still a cache."""
    check(path)
    write_bytes(path, data)
