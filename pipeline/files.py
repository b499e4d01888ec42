"""Reading inputs and writing outputs. A file the project reads from a user's path is a regular file
of bounded size (`read_regular`). Every file and directory written appears complete or not at all,
gets the usual modes (umask applies), and a failed write names its path. Temporary names carry the
writer's pid, so a later writer removes what a killed one left behind and nothing of a live one."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipeline.errors import ConfigError, OutputError


def read_regular(path: str | Path, what: str, limit: int, error: type[Exception] = ConfigError) -> bytes:
    """The bytes of `path`: a regular file (opened without waiting on a pipe; a device is refused, not
    read without end) of at most `limit` bytes.

    Raises:
        `error`: one line naming `what`, the path and the fix.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise error(f"{what} = {str(path)!r} cannot be read ({exc.strerror or exc}); name an existing file") from None
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{what} = {str(path)!r} is not a regular file (a pipe, socket, device or folder); name a file")
        if info.st_size > limit:
            raise error(f"{what} = {str(path)!r} is {info.st_size} bytes, more than the {limit} such a file may have; "
                        "name the file meant")
        return f.read(limit)


def read_cache(path: str | Path, what: str, magic: bytes, limit: int, error: type[Exception]) -> bytes:
    """A cache file the project reads before its work and replaces after it (TensorRT's timing and
    runtime caches): b"" where there is none yet. A path that holds anything but such a cache (no
    `magic` first), a link or no regular file is refused, so the write never replaces a file the
    project did not create.

    Raises:
        `error`: one line naming `what`, the path and the fix.
    """
    where = Path(path)
    if where.is_symlink():
        raise error(f"{what} = {str(path)!r} is a symbolic link; name the file itself")
    if not os.path.lexists(where):
        return b""
    data = read_regular(where, what, limit, error)
    if not data.startswith(magic):
        raise error(f"{what} = {str(path)!r} holds a file that is not the cache the build writes there ({len(data)} "
                    "bytes), which it would replace; name a new path")
    return data


def write_cache(path: str | Path, data: bytes, what: str, magic: bytes, limit: int, error: type[Exception]) -> None:
    """Replace the cache at `path` with `data`, claimed first (`read_cache`: what is there is still a cache)."""
    read_cache(path, what, magic, limit, error)
    write_bytes(path, data)


def umask() -> int:
    """The process umask (read without changing it for longer than the call)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def temp_prefix(target: Path) -> str:
    """The name prefix of this process's temporaries for `target` (`remove_stale_temporaries` reads it)."""
    return f".{target.name}.tmp-{os.getpid()}-"


def _stale(entry: Path, name: str) -> bool:
    """Whether `entry` is a temporary of `name` (exactly `temp_prefix`'s form, then tempfile's random
    suffix) whose writer is gone; anything else beside the target (a user's `.params.yaml.swp`) is
    never ours."""
    found = re.fullmatch(rf"\.{re.escape(name)}\.tmp-(\d+)-[a-z0-9_]+", entry.name)
    if found is None or int(found.group(1)) == os.getpid():
        return False
    try:
        os.kill(int(found.group(1)), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False


def remove_stale_temporaries(target: Path) -> list[Path]:
    """Remove temporaries of `target` left by writers that no longer run; return what went."""
    removed: list[Path] = []
    if not target.parent.is_dir():
        return removed
    for entry in target.parent.iterdir():
        if _stale(entry, target.name):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn an OSError raised while writing `path` into an `OutputError` that names it."""
    try:
        yield
    except OutputError:
        raise
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc} (free space or fix permissions, then run again)") \
            from exc


@contextmanager
def atomic_dir(path: str | Path) -> Iterator[Path]:
    """A temporary directory that replaces `path` only when the block succeeds."""
    target = Path(path)
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=temp_prefix(target)))
    try:
        with writing(target):
            yield tmp
            fix_modes(tmp)
            if target.exists():
                shutil.rmtree(target)
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_bytes(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` atomically, with the umask's mode."""
    target = Path(path)
    with writing(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=temp_prefix(target))
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o666 & ~umask())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return target


def write_json(path: str | Path, data: Any) -> Path:
    """Write JSON atomically (sorted keys: equal data, equal bytes)."""
    return write_bytes(path, (json.dumps(data, indent=2, sort_keys=True, default=str) + "\n").encode())


def fix_modes(root: Path) -> None:
    """Give a tree written under temporary names the modes its files would have had (umask applies)."""
    mask = umask()
    os.chmod(root, 0o777 & ~mask)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o777 & ~mask)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o666 & ~mask)
