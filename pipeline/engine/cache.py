"""The engine cache: built engines looked up by a key that covers everything an engine depends on,
in a local folder (default) or any fsspec URL a cluster shares.

The key is the SHA-256 of: the subgraph in canonical form (every node's op, target, arguments and
value dtype/shape, every constant's bytes, the symbolic dims' ranges), every compile-spec field that
reaches the builder (all but `method` and `timing_cache_path`), and the toolchain (TensorRT flavour
and version, the platform, the source of `pipeline.engine`, converters included, and of `pipeline.delegate`, and
`NVIDIA_TF32_OVERRIDE` where set). An entry is `<key>.engine`: b"PEC1", a u32 length, JSON (key,
engine SHA-256 and size, bindings, layers, the TF32 override recorded at build), then
the engine. It is published atomically (written under a temporary name, then renamed), checked on
every read (its key, size and digest; a bad entry is deleted and the engine rebuilt, never used),
and the least recently used entries go when the cache outgrows its bound; only files that are
entries (`<64 hex digits>.engine` starting with b"PEC1") are ever counted or deleted.

Trust: the digests hold against damage, not against someone who may write the cache folder, who
could store any engine with a matching header. Where others may write a shared cache, give every
machine that uses it one secret in `$PIPELINE_ENGINE_CACHE_KEY`: entries then carry an HMAC-SHA256
of their header (which holds the engine's digest) under that secret, and an entry without a valid
one is never used (the engine is built and published with one). A cache that cannot be written
(read-only, unreachable) is read where it can be and warned about, never fatal to a build.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import platform
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import fsspec
import torch

from pipeline.delegate import blob
from pipeline.engine import build_env
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.network import GraphSource
from pipeline.engine.trt_api import flavour
from pipeline.errors import ConfigError
from pipeline.files import write_bytes

log = logging.getLogger("pipeline.engine")

MAGIC = b"PEC1"
_LENGTH = struct.Struct("<I")
ENV = "PIPELINE_ENGINE_CACHE"
KEY_ENV = "PIPELINE_ENGINE_CACHE_KEY"  # a secret shared by the machines that write and read one cache
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}\.engine")
DEFAULT_MAX_BYTES = 20 << 30
# Fields that do not change the engine: the method's name, and the timing cache (a build-time aid).
_NOT_IN_KEY = {"method", "timing_cache_path"}


@dataclass(frozen=True)
class Entry:
    """A cached engine: what `builder.BuiltEngine` holds, less the seconds its build took."""

    engine: bytes
    metadata: blob.BlobMetadata
    num_layers: int


@dataclass(frozen=True)
class Event:
    """One lookup: the engine's label, its key, and whether the cache had it."""

    label: str
    key: str
    hit: bool


@dataclass
class EngineCache:
    """A store of built engines (see the module docstring).

    Attributes:
        url: a folder or fsspec URL ("s3://bucket/engines", "file:///shared/engines"); default
            `$PIPELINE_ENGINE_CACHE` or `~/.cache/trt-executorch-pipeline/engines`.
        max_bytes: bound on the entries' total size; least recently used entries go past it.
        toolchain: what the key says about the toolchain; default: `toolchain_id()`.
        events: every lookup of this cache object, in order (hits and misses, for reports).
    """

    url: str | None = None
    max_bytes: int | None = DEFAULT_MAX_BYTES
    toolchain: str | None = None
    events: list[Event] = field(default_factory=list)

    def __post_init__(self) -> None:
        secret = _secret()
        if secret is not None and not secret.strip():  # set to nothing: never authentication off
            raise ConfigError(f"${KEY_ENV} is set but empty, which would turn the cache's authentication off; set it "
                              f"to the secret the machines sharing this cache use, or unset it (`unset {KEY_ENV}`)")
        self.url = self.url or os.environ.get(ENV) or str(Path.home() / ".cache" / "trt-executorch-pipeline" / "engines")
        self._fs, self._root = fsspec.core.url_to_fs(self.url)
        self._local = "file" in _protocols(self._fs)
        try:
            self._fs.makedirs(self._root, exist_ok=True)
        except OSError as exc:  # read-only: entries are still read where they exist
            log.warning("engine cache: cannot create %s (%s); engines are built and not stored", self.url, exc)

    def key(self, source: GraphSource, spec: TensorRTCompileSpec) -> str:
        """The key of the engine `source` builds into under `spec`."""
        digest = hashlib.sha256()
        digest.update((self.toolchain or toolchain_id()).encode())
        options = {f.name: getattr(spec, f.name) for f in fields(spec) if f.name not in _NOT_IN_KEY}
        digest.update(repr(sorted(options.items())).encode())
        for part in canonical_graph(source):
            digest.update(part)
        if source.channels_last:
            digest.update(repr(sorted(source.channels_last)).encode())
        if spec.quantize.active:  # which weights quantize hangs on their names (quantize.keep)
            digest.update(repr(sorted(source.names.items())).encode())
        return digest.hexdigest()

    def get(self, key: str, label: str = "engine") -> Entry | None:
        """The entry under `key` after checking it, or None (a bad entry is deleted; an entry without
        a valid HMAC where `$PIPELINE_ENGINE_CACHE_KEY` is set is left alone and not used)."""
        path = self._path(key)
        try:
            data = self._fs.cat_file(path)
        except FileNotFoundError:
            data = None
        except OSError as exc:
            log.warning("engine cache: cannot read %s (%s); building the engine", path, exc)
            data = None
        entry = None if data is None else _decode(data, key)
        if data is not None and entry is None:
            log.warning("engine cache: %s is damaged or not what its key says; deleting it and building again", path)
            self._remove(path)
        elif data is not None and not _authentic(data):
            log.warning("engine cache: %s has no valid HMAC under $%s (written without the key, or by someone "
                        "else); building the engine", path, KEY_ENV)
            entry = None
        elif entry is not None and self._local:
            try:
                os.utime(path)  # recency for eviction
            except OSError:  # another process evicted it since; the bytes read are whole and checked
                pass
        self.events.append(Event(label, key, entry is not None))
        return entry

    def put(self, key: str, entry: Entry) -> None:
        """Publish `entry` under `key` atomically, then keep the cache within `max_bytes`; a cache that
        cannot be written is warned about, and the build goes on."""
        path = self._path(key)
        data = _encode(key, entry)
        try:
            if self._local:  # a temporary named by pid, renamed; what a killed writer left goes with the next write
                write_bytes(path, data)
            else:  # one object PUT is atomic on object stores
                self._fs.pipe_file(path, data)
            self.evict()
        except OSError as exc:
            log.warning("engine cache: cannot store the engine in %s (%s); the build goes on without caching it",
                        self.url, exc)

    def clear(self) -> None:
        """Delete every entry, and the folder if nothing else is in it."""
        for path, _, _ in list(self._entries()):
            self._remove(path)
        try:
            if self._fs.exists(self._root) and not self._fs.ls(self._root):
                self._fs.rmdir(self._root)
        except OSError:
            pass

    def evict(self) -> None:
        """Delete least recently used entries until the total size is within `max_bytes`."""
        if self.max_bytes is None:
            return
        entries = sorted(self._entries(), key=lambda e: e[2])
        total = sum(size for _, size, _ in entries)
        for path, size, _ in entries:
            if total <= self.max_bytes:
                break
            self._remove(path)
            total -= size

    def _entries(self) -> Iterator[tuple[str, int, float]]:
        """The cache's own entries: `<key>.engine` files that begin with its magic (nothing else in
        the folder is counted or deleted)."""
        try:
            listing = self._fs.ls(self._root, detail=True)
        except FileNotFoundError:
            return
        for info in listing:
            name = str(info["name"])
            if info.get("type") == "file" and _ENTRY_NAME.fullmatch(name.rsplit("/", 1)[-1]) and self._is_entry(name):
                yield name, int(info.get("size") or 0), float(info.get("mtime") or info.get("created") or 0.0)

    def _is_entry(self, path: str) -> bool:
        try:
            with self._fs.open(path, "rb") as f:
                return bool(f.read(len(MAGIC)) == MAGIC)
        except OSError:
            return False

    def _path(self, key: str) -> str:
        return f"{self._root.rstrip('/')}/{key}.engine"

    def _remove(self, path: str) -> None:
        try:
            self._fs.rm_file(path)
        except FileNotFoundError:
            pass


def toolchain_id() -> str:
    """TensorRT flavour and version, platform, a digest of the source of `pipeline.engine`
    and `pipeline.delegate`, and
    `NVIDIA_TF32_OVERRIDE` where it is set (the engine keeps it: `build_env.py`)."""
    return _toolchain_id() + "".join(f";{name}={value}" for name, value in build_env.setting().items())


@functools.cache
def _toolchain_id() -> str:
    from pipeline.engine.toolchain import source_digest

    found = flavour()
    package = Path(__file__).parent
    return (f"{found.module}=={found.version};{platform.system()}-{platform.machine()};code={source_digest(package)}"
            f";format={source_digest(package.parent / 'delegate')}")


def canonical_graph(source: GraphSource) -> Iterator[bytes]:
    """The subgraph as bytes that two equal graphs share: nodes in order with their targets,
    arguments and value types; constants by content; the ranges of symbolic dims."""
    symbols: set[str] = set()
    for node in source.graph.nodes:
        val = node.meta.get("val")
        typed = _typed(val, symbols)
        yield f"{node.op}|{node.name}|{node.target}|{_arg(node.args)}|{_arg(node.kwargs)}|{typed}\n".encode()
        constant = source.constants.get(node.name) if node.op == "placeholder" else None
        if constant is not None:
            tensor = constant.detach().cpu().contiguous()
            yield f"const|{tensor.dtype}|{list(tensor.shape)}|".encode()
            yield hashlib.sha256(tensor.reshape(-1).view(torch.uint8).numpy().tobytes() if tensor.numel() else b"").digest()
    for symbol, bound in sorted((str(k), v) for k, v in source.range_constraints.items()):
        if symbol in symbols:
            yield f"range|{symbol}|{bound.lower}|{bound.upper}\n".encode()


def _typed(val: Any, symbols: set[str]) -> str:
    if isinstance(val, (list, tuple)):
        return "[" + ",".join(_typed(v, symbols) for v in val) + "]"
    if isinstance(val, torch.Tensor):
        dims = []
        for size in val.shape:
            dims.append(str(size))
            if not isinstance(size, int):
                symbols.update(str(s) for s in size.node.expr.free_symbols)
        return f"{val.dtype}{dims}"
    return type(val).__name__ if val is not None else "-"


def _arg(value: Any) -> str:
    if isinstance(value, torch.fx.Node):
        return f"%{value.name}"
    if isinstance(value, (list, tuple)):
        return "(" + ",".join(_arg(v) for v in value) + ")"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_arg(v)}" for k, v in sorted(value.items())) + "}"
    return repr(value)


def _encode(key: str, entry: Entry) -> bytes:
    doc = {"key": key, "sha256": hashlib.sha256(entry.engine).hexdigest(), "size": len(entry.engine),
           "num_layers": entry.num_layers, "target_platform": entry.metadata.target_platform,
           **blob.tf32_override_doc(entry.metadata), "io_bindings": [b.to_json() for b in entry.metadata.io_bindings]}
    secret = _secret()
    if secret is not None:  # never empty: EngineCache refuses that
        doc["hmac"] = _mac(secret, json.dumps(doc, separators=(",", ":")).encode())
    head = json.dumps(doc, separators=(",", ":")).encode()
    return MAGIC + _LENGTH.pack(len(head)) + head + entry.engine


def _secret() -> bytes | None:
    """`$PIPELINE_ENGINE_CACHE_KEY` as the bytes it holds (any bytes: the environment need not be UTF-8)."""
    return os.environb.get(KEY_ENV.encode())


def _mac(secret: bytes, head: bytes) -> str:
    return hmac.new(secret, MAGIC + head, hashlib.sha256).hexdigest()


def _authentic(data: bytes) -> bool:
    """Whether an entry (already decoded whole) carries a valid HMAC, where `$PIPELINE_ENGINE_CACHE_KEY`
    asks for one; the HMAC covers the header, which holds the engine's size and digest."""
    secret = _secret()
    if secret is None:
        return True
    (length,) = _LENGTH.unpack_from(data, 4)
    doc = json.loads(data[8 : 8 + length].decode())
    tag = doc.pop("hmac", None)
    return isinstance(tag, str) and hmac.compare_digest(tag, _mac(secret, json.dumps(doc, separators=(",", ":")).encode()))


def _decode(data: bytes, key: str) -> Entry | None:
    """The entry in `data` if it is whole and holds the engine `key` names; else None."""
    try:
        if data[:4] != MAGIC:
            return None
        (length,) = _LENGTH.unpack_from(data, 4)
        doc = json.loads(data[8 : 8 + length].decode())
        engine = data[8 + length :]
        if doc["key"] != key or doc["size"] != len(engine) or hashlib.sha256(engine).hexdigest() != doc["sha256"]:
            return None
        bindings = tuple(blob.IOBinding.from_json(b) for b in doc["io_bindings"])
        meta = blob.BlobMetadata(io_bindings=bindings, target_platform=str(doc["target_platform"]),
                                 tf32_override=blob.read_tf32_override(doc))
        return Entry(engine, meta, int(doc["num_layers"]))
    except (struct.error, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return None


def _protocols(fs: Any) -> set[str]:
    protocol = fs.protocol
    return set(protocol) if isinstance(protocol, (tuple, list)) else {protocol}

