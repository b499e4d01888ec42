"""The engine cache: a hit gives the engine built before, a key covers everything the engine depends
on (and nothing else), a damaged entry is rebuilt and never used, writers race safely, the cache
stays within its bound (least recently used goes), and any fsspec URL serves."""

import multiprocessing
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from pipeline.config.compose import compose, typed
from pipeline.delegate import blob
from pipeline.engine.cache import EngineCache, Entry
from pipeline.engine.compile_spec import TensorRTCompileSpec
from pipeline.engine.network import graph_source
from pipeline.errors import ConfigError
from pipeline.lowering.compile import compile_method
from pipeline.runtime.engine_op import is_engine_call
from pipeline.steps import run_compile

X = torch.randn(4, 16, generator=torch.Generator().manual_seed(0))


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).eval()


def _engines(program: Any) -> list[bytes]:
    constants = graph_source(program).constants
    return [bytes(constants[n.args[1].name].numpy()) for n in program.graph.nodes if is_engine_call(n)]


def _compile(cache: EngineCache, seed: int = 0, x: torch.Tensor = X, method: str = "forward", **spec: Any) -> list[bytes]:
    return _engines(compile_method(_model(seed), (x,), TensorRTCompileSpec(**spec), method=method, cache=cache))


def test_second_compile_takes_the_engine_from_the_cache(tmp_path: Path) -> None:
    cache, second = EngineCache(str(tmp_path)), EngineCache(str(tmp_path))
    first = _compile(cache)
    again = _compile(second)
    assert again == first and [e.hit for e in cache.events] == [False]
    assert [e.hit for e in second.events] == [True]  # taken from the cache, not built again
    assert len(list(tmp_path.glob("*.engine"))) == 1


class _ScalarBuffer(torch.nn.Module):
    def __init__(self, scale: float) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(scale))  # a 0-d constant reaches the engine whole
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.scale


def test_zero_dimensional_constants_are_keyed_by_value(tmp_path: Path) -> None:
    cache = EngineCache(str(tmp_path))
    for scale in (2.0, 2.0, 3.0):
        torch.manual_seed(0)
        compile_method(_ScalarBuffer(scale), (X,), cache=cache)
    assert [e.hit for e in cache.events] == [False, True, False]


@pytest.mark.parametrize("change, hit", [
    ({"seed": 1}, False),                       # other weights
    ({"x": torch.randn(2, 16)}, False),         # other input shape
    ({"precision": "fp16"}, False),             # a compile-spec field the builder reads
    ({"optimization_level": 1}, False),
    ({"method": "decode"}, True),               # the method's name only labels the engine
], ids=["weights", "shape", "precision", "opt-level", "method-name"])
def test_key_covers_what_the_engine_depends_on(tmp_path: Path, change: dict[str, Any], hit: bool) -> None:
    _compile(EngineCache(str(tmp_path)))
    cache = EngineCache(str(tmp_path))
    _compile(cache, **change)
    assert [e.hit for e in cache.events] == [hit]


def test_toolchain_change_never_reuses_an_engine(tmp_path: Path) -> None:
    _compile(EngineCache(str(tmp_path)))
    other = EngineCache(str(tmp_path), toolchain="tensorrt_rtx==9.9.9;Linux-x86_64;code=0")
    _compile(other)
    assert [e.hit for e in other.events] == [False] and len(list(tmp_path.glob("*.engine"))) == 2


def _damage(path: Path, how: str, other: Path) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flipped":
        path.write_bytes(data[:-100] + bytes([data[-100] ^ 1]) + data[-99:])
    elif how == "empty":
        path.write_bytes(b"")
    else:  # another key's entry under this name
        path.write_bytes(other.read_bytes())


@pytest.mark.parametrize("how", ["truncated", "flipped", "empty", "other-key"])
def test_damaged_entry_is_rebuilt_never_used(tmp_path: Path, how: str) -> None:
    good = _compile(EngineCache(str(tmp_path)))
    _compile(EngineCache(str(tmp_path)), seed=1)
    entry, other = sorted(tmp_path.glob("*.engine"), key=lambda p: p.stat().st_mtime)
    _damage(entry, how, other)
    cache = EngineCache(str(tmp_path))
    rebuilt = _compile(cache)
    assert [e.hit for e in cache.events] == [False]
    assert blob.EngineRef.of(rebuilt[0]).size == blob.EngineRef.of(good[0]).size  # a whole engine, built again
    assert cache.get(cache.events[0].key) is not None  # and published again, whole


def _entry(size: int, fill: int) -> Entry:
    meta = blob.BlobMetadata(io_bindings=(blob.IOBinding("x", "float32", (4,), True),))
    return Entry(bytes([fill]) * size, meta, 1)


def _writer(url: str, worker: int, rounds: int) -> None:
    cache = EngineCache(url, max_bytes=None)
    for _ in range(rounds):
        for key in ("a" * 64, "b" * 64, "c" * 64):
            cache.put(key, _entry(1 << 20, ord(key[0])))  # the same engine from every writer
            found = cache.get(key)
            assert found is None or found.engine == _entry(1 << 20, ord(key[0])).engine


def test_concurrent_writers_leave_only_whole_entries(tmp_path: Path) -> None:
    url = str(tmp_path)
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_writer, args=(url, w, 10)) for w in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    cache = EngineCache(url)
    assert all(cache.get(k * 64) is not None for k in "abc") and not list(tmp_path.glob("*.tmp-*"))


def test_least_recently_used_entries_go_past_the_bound(tmp_path: Path) -> None:
    cache = EngineCache(str(tmp_path), max_bytes=int(2.5 * (1 << 20)))
    cache.put("a" * 64, _entry(1 << 20, 1))
    time.sleep(0.05)
    cache.put("b" * 64, _entry(1 << 20, 2))
    time.sleep(0.05)
    assert cache.get("a" * 64) is not None  # a is now the most recently used
    time.sleep(0.05)
    cache.put("c" * 64, _entry(1 << 20, 3))
    assert {p.stem[0] for p in tmp_path.glob("*.engine")} == {"a", "c"}


@pytest.mark.parametrize("scheme", ["memory", "file"])
def test_any_fsspec_url(tmp_path: Path, scheme: str) -> None:
    url = f"memory://engines-{tmp_path.name}" if scheme == "memory" else f"file://{tmp_path}/shared"
    first = _compile(EngineCache(url))
    cache = EngineCache(url)
    assert _compile(cache) == first and [e.hit for e in cache.events] == [True]


def test_compile_step_reports_hits_and_misses(tmp_path: Path) -> None:
    cfg: Any = typed(compose([f"cache.url={tmp_path / 'engines'}"]))
    label = "engine 1/1 of method 'forward'"
    assert run_compile(cfg, tmp_path / "a")["engine_cache"] == {"hits": 0, "misses": 1, "engines": {label: "miss"}}
    assert run_compile(cfg, tmp_path / "b")["engine_cache"] == {"hits": 1, "misses": 0, "engines": {label: "hit"}}
    assert (tmp_path / "a" / "forward.pt2").read_bytes() == (tmp_path / "b" / "forward.pt2").read_bytes()
    off: Any = typed(compose(["cache=off"]))
    assert "engine_cache" not in run_compile(off, tmp_path / "c")


def test_eviction_deletes_only_the_caches_own_entries(tmp_path: Path) -> None:
    """A cache folder may hold the user's files too (`cache.url=my_engines`): they are never counted or deleted."""
    theirs = {"model.engine": b"PEC1 not an entry", "notes.txt": b"mine", "f" * 64 + ".engine": b"TRT engine of mine"}
    for name, data in theirs.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / ("e" * 64 + ".engine")).mkdir()
    cache = EngineCache(str(tmp_path), max_bytes=600_000)
    for key in "abc":
        cache.put(key * 64, _entry(500_000, ord(key)))
    assert {name: (tmp_path / name).read_bytes() for name in theirs} == theirs and (tmp_path / ("e" * 64 + ".engine")).is_dir()
    assert [k for k in "abc" if (tmp_path / f"{k * 64}.engine").exists()] == ["c"]
    cache.clear()
    assert not list(tmp_path.glob("c*.engine")) and {name: (tmp_path / name).read_bytes() for name in theirs} == theirs
    memory = EngineCache("memory://pipeline-test-clear", max_bytes=None)
    memory.put("a" * 64, _entry(100, 1))
    memory.clear()
    assert memory.get("a" * 64) is None


def _evicting(url: str, rounds: int) -> None:
    cache = EngineCache(url, max_bytes=int(1.5 * (1 << 20)))  # room for one entry: every put evicts
    for _ in range(rounds):
        for key in ("a" * 64, "b" * 64):
            cache.put(key, _entry(1 << 20, ord(key[0])))
            found = cache.get(key)
            assert found is None or found.engine == _entry(1 << 20, ord(key[0])).engine


def test_writers_that_evict_and_readers_of_one_key_race_safely(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_evicting, args=(str(tmp_path), 25)) for _ in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0]


def _forge(path: Path, engine: bytes) -> None:
    """What a writer of a shared folder can do: new engine bytes under a header whose digest and size match."""
    import hashlib
    import json
    import struct

    data = path.read_bytes()
    (length,) = struct.unpack_from("<I", data, 4)
    doc = json.loads(data[8 : 8 + length])
    doc.update(sha256=hashlib.sha256(engine).hexdigest(), size=len(engine))
    head = json.dumps(doc, separators=(",", ":")).encode()
    path.write_bytes(data[:4] + struct.pack("<I", len(head)) + head + engine)


def test_a_secret_authenticates_entries_of_a_shared_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key, evil = "d" * 64, b"\x00" * 4096
    EngineCache(str(tmp_path)).put(key, _entry(4096, 7))  # written before the machines shared a secret
    monkeypatch.setenv("PIPELINE_ENGINE_CACHE_KEY", "s3cret")
    assert EngineCache(str(tmp_path)).get(key) is None and (tmp_path / f"{key}.engine").exists()  # left alone, not used
    cache = EngineCache(str(tmp_path))
    cache.put(key, _entry(4096, 7))
    assert cache.get(key).engine == _entry(4096, 7).engine  # type: ignore[union-attr]
    _forge(tmp_path / f"{key}.engine", evil)
    assert cache.get(key) is None
    monkeypatch.setenv("PIPELINE_ENGINE_CACHE_KEY", "another")
    cache.put("9" * 64, _entry(4096, 8))
    monkeypatch.setenv("PIPELINE_ENGINE_CACHE_KEY", "s3cret")
    assert cache.get("9" * 64) is None  # another secret's entry
    monkeypatch.delenv("PIPELINE_ENGINE_CACHE_KEY")
    assert cache.get(key).engine == evil  # type: ignore[union-attr]  # without a secret: integrity only (documented)


@pytest.mark.parametrize("secret", ["", "  "])
def test_an_empty_secret_is_refused_not_taken_as_none(secret: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret set to nothing would turn authentication off without a word, and a forged entry be used."""
    key = "e" * 64
    EngineCache(str(tmp_path)).put(key, _entry(4096, 7))
    _forge(tmp_path / f"{key}.engine", b"\x00" * 4096)
    monkeypatch.setenv("PIPELINE_ENGINE_CACHE_KEY", secret)
    with pytest.raises(ConfigError, match=r"PIPELINE_ENGINE_CACHE_KEY is set but empty.*unset it"):
        EngineCache(str(tmp_path))


def test_a_cache_that_cannot_be_written_never_fails_a_build(tmp_path: Path) -> None:
    cache = EngineCache("/proc/pipeline-engines")  # procfs: no folder can be made, nothing written
    cache.put("a" * 64, _entry(4096, 1))
    assert cache.get("a" * 64) is None
    assert len(_compile(cache)) == 1 and [e.hit for e in cache.events] == [False, False]


def test_a_secret_of_any_bytes_authenticates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret that is not UTF-8 (the environment holds bytes) is a secret like any other: no
    traceback after the build, and another secret's entries stay unused."""
    key = "f" * 64
    monkeypatch.setitem(os.environb, b"PIPELINE_ENGINE_CACHE_KEY", b"\xff\xfe-not-utf8")
    cache = EngineCache(str(tmp_path))
    cache.put(key, _entry(4096, 5))
    assert cache.get(key).engine == _entry(4096, 5).engine  # type: ignore[union-attr]
    monkeypatch.setitem(os.environb, b"PIPELINE_ENGINE_CACHE_KEY", b"\xff\xfd-not-utf8")
    assert EngineCache(str(tmp_path)).get(key) is None
