"""A warm interpreter for DVC's stages: torch, TensorRT and ExecuTorch imported once, each stage run
in a fresh fork of it (issue 55: each stage spent 4.5-7 s importing them, the in-process build once).

A stage that imports the libraries hands itself over (`hand_over`, called by `stages/_common.run`):
it connects to the server of its key, starting one if there is none, and sends its argv, working
folder, environment, umask and standard streams (the file descriptors themselves). The server forks
a monitor per stage, which forks the stage, relays the signals the stage's own process receives,
ends the stage if that process goes away, and returns the stage's exit status. What the stage runs
is read from disk in the fork: the server imports no module of this project beyond this one (which
the fork forgets, with `pipeline` itself), only the third-party libraries in `PRELOAD`, and only the
same interpreter, search path, library files, this file and the environment give the same key. It
forks only while it runs one Python thread and CUDA is uninitialized (it runs no computation: native
thread pools such as OpenBLAS's handle a fork themselves); it leaves after `IDLE_S` seconds without
a stage, and it writes no file (a Linux abstract socket, peers checked to be this user).
`PIPELINE_STAGE_SERVER=off` runs every stage in its own interpreter, as does any failure to reach a
server.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from typing import Any

SWITCH = "PIPELINE_STAGE_SERVER"
SERVED = "PIPELINE_STAGE_SERVED"  # set in a served stage: it runs its main, never hands over again
IDLE_S = 30.0  # longer than DVC takes between two stages
START_S = 20.0  # for a new server to listen; its imports may take longer (the stage waits on them)
# What the heavy stages import (measured with -X importtime on the MLP and ResNet-18 builds); not
# TensorRT (0.06 s), whose import may reach the CUDA driver, which a fork must not inherit.
PRELOAD = ("numpy", "yaml", "omegaconf", "hydra", "sympy", "networkx", "jinja2", "torch", "torch.export",
           "torch.fx.experimental.symbolic_shapes", "torch._dynamo", "torch._functorch.aot_autograd",
           "torch._export", "torchvision", "torchao", "executorch.exir", "executorch.exir.passes",
           "executorch.exir.backend.backend_api", "executorch.exir._serialize._program",
           "executorch.extension.flat_tensor.serialize.serialize")
# Variables DVC, the shell, pyenv's shims and pytest set per command (a shim appends to its own
# each time it is passed through); every other one is part of the key: a variable a library reads
# at import costs, at worst, a server of its own.
_PER_COMMAND = ("PWD", "OLDPWD", "SHLVL", "_", "PYTEST_CURRENT_TEST", SERVED)
_PER_COMMAND_PREFIXES = ("DVC_", "PYENV_")
_HEADER = struct.Struct("!I")
_RACE = 3  # the server's exit status where another one of its key already listens


def _key(path: list[str]) -> str:
    """What must match for a fork of the server to be this interpreter: the executable and its flags,
    the search path `path` (without a script's folder), each preloaded library's files, this file and
    the environment."""
    flags = sys.flags
    origins = []
    for name in {m.split(".")[0] for m in PRELOAD}:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec and spec.origin else ""
        origins.append((name, origin, os.stat(origin).st_mtime_ns if origin else 0))
    env = sorted((k, v) for k, v in os.environ.items() if k not in _PER_COMMAND and not k.startswith(_PER_COMMAND_PREFIXES))
    origins.append(("stage_server", __file__, os.stat(__file__).st_mtime_ns))
    facts = [sys.executable, sys.version, path, sys.warnoptions, flags.optimize, flags.dont_write_bytecode,
             flags.utf8_mode, flags.dev_mode, flags.isolated, sorted(origins), env, os.getuid()]
    return hashlib.sha256(json.dumps(facts, default=str).encode()).hexdigest()[:32]


def _address(key: str) -> bytes:
    return b"\0pipeline-stage-server-" + key.encode()


def _same_user(sock: socket.socket) -> bool:
    _, uid, _ = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return uid == os.getuid()


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    data = json.dumps(message).encode()
    if fds:
        socket.send_fds(sock, [_HEADER.pack(len(data)) + data], fds)
    else:
        sock.sendall(_HEADER.pack(len(data)) + data)


def _receive(sock: socket.socket, fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """One message (and up to `fds` descriptors); raises EOFError where the peer is gone."""
    if fds:
        head, got, _, _ = socket.recv_fds(sock, _HEADER.size, fds)
    else:
        head, got = sock.recv(_HEADER.size, socket.MSG_WAITALL), []
    if len(head) < _HEADER.size:
        raise EOFError
    (size,) = _HEADER.unpack(head)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return json.loads(data), list(got)


# --- the stage's side -------------------------------------------------------------------------------


def hand_over() -> None:
    """Run this command (a script, or a module run with -m: `sys.argv`) in a fork of the warm server and
    exit with its status; return where it must run here (switched off, already served, or no server
    could be reached: nothing ran there)."""
    status = _served()
    if status is not None:
        sys.exit(status)


def _served() -> int | None:
    if os.environ.get(SERVED) or os.environ.get(SWITCH, "on").lower() in ("off", "0", "false") or not sys.platform.startswith("linux"):
        return None
    key = _key(sys.path[1:])
    sock = _connect(key)
    if sock is None:
        return None
    spec = getattr(sys.modules["__main__"], "__spec__", None)  # set where it runs with -m
    module = spec.name if spec is not None else None
    with sock:
        request = {"argv": sys.argv, "module": module, "path0": sys.path[0], "cwd": os.getcwd(), "env": dict(os.environ),
                   "umask": _umask(), "key": key}
        try:
            sock.settimeout(START_S + 300)  # the server's imports
            _send(sock, request, [0, 1, 2])
            reply, _ = _receive(sock)  # the monitor's "started", or a refusal: nothing ran
            sock.settimeout(None)
        except (OSError, EOFError):
            return None
        if "refused" in reply:
            return None
        return _wait(sock)


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _connect(key: str) -> socket.socket | None:
    """A connection to the server of `key`, started here if there is none; None where none answers."""
    started = None
    deadline = time.monotonic() + START_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(_address(key))
            if _same_user(sock):
                return sock
            sock.close()
            return None
        except OSError:
            sock.close()
        if started is None:
            # -P: no folder of its own on the search path, which is then this stage's less the script's
            started = subprocess.Popen([sys.executable, "-P", "-m", "pipeline.stage_server", key], stdin=subprocess.DEVNULL,
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, cwd="/")
        if started.poll() not in (None, _RACE) or time.monotonic() > deadline:
            return None  # it is not this interpreter, or it failed: no server
        time.sleep(0.02)


def _wait(sock: socket.socket) -> int:
    """Relay this process's SIGINT, SIGTERM and SIGHUP to the stage until it ends; its exit status."""
    def relay(signum: int, _frame: Any) -> None:
        try:
            _send(sock, {"signal": signum})
        except OSError:
            pass

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, relay)
    try:
        reply, _ = _receive(sock)
    except (OSError, EOFError):
        print("pipeline: the warm stage server ended before the stage did; run it again, or set "
              f"{SWITCH}=off", file=sys.stderr)
        return 1
    return int(reply["status"])


# --- the server's side ------------------------------------------------------------------------------


def serve(key: str) -> int:
    """Listen on `key`'s address, import `PRELOAD`, then fork a monitor per stage until idle."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(_address(key))
    except OSError:
        return _RACE  # another server of this key is there: the stage connects to it
    server.listen(16)
    if _key(sys.path) != key:  # not the interpreter the stage is
        return 1
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001,S112 - a library this environment lacks: the stages import what they need
            continue
    import gc

    gc.collect()
    gc.freeze()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # monitors are reaped by the kernel
    while select.select([server], [], [], IDLE_S)[0]:
        conn, _ = server.accept()
        if not _same_user(conn):
            conn.close()
            continue
        if not _forkable():
            _refuse(conn)  # and go on answering, so that stages do not start another server
            continue
        if os.fork() == 0:
            server.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            os._exit(_monitor(conn, key))
        conn.close()
    return 0


def _forkable() -> bool:
    """One Python thread, and CUDA not initialized: what a fork needs to be a working interpreter."""
    import threading

    torch = sys.modules.get("torch")
    return threading.active_count() == 1 and not (torch is not None and torch.cuda.is_initialized())


def _refuse(conn: socket.socket) -> None:
    try:
        _receive(conn, 3)
        _send(conn, {"refused": "this server cannot fork safely"})
    except (OSError, EOFError):
        pass
    conn.close()


def _monitor(conn: socket.socket, key: str) -> int:
    """Fork the stage, relay signals to it, end it if its client goes; report its exit status."""
    try:
        request, fds = _receive(conn, 3)
        if len(fds) != 3 or request.get("key") != key:
            _send(conn, {"refused": "not this server's interpreter"})
            return 0
        _send(conn, {"started": True})
    except (OSError, EOFError):
        return 0
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run_stage(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    watch = os.pidfd_open(pid)
    status = None
    while status is None:
        ready = select.select([conn.fileno(), watch], [], [])[0]
        if watch in ready:
            status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            break
        try:
            message, _ = _receive(conn)
            os.kill(pid, int(message["signal"]))
        except (OSError, EOFError, KeyError, ValueError):
            os.kill(pid, signal.SIGTERM)  # the stage's client went away (killed): the stage goes too
            os.waitpid(pid, 0)
            return 0
    code = status if status >= 0 else 128 - status  # killed by a signal: the shell's convention
    try:
        _send(conn, {"status": code})
    except OSError:
        pass
    return 0


def _run_stage(request: dict[str, Any], fds: list[int]) -> None:
    """In the fork: become the stage's process (its streams, folder, environment, umask, argv, fresh
    project modules) and run its script as `__main__`; exit with its status."""
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[SERVED] = "1"
    os.umask(int(request["umask"]))
    for name in [m for m in sys.modules if m == "pipeline" or m.startswith("pipeline.")]:
        del sys.modules[name]
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own streams, not files to close
    sys.stdout = open(1, "w", closefd=False, buffering=1 if os.isatty(1) else -1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1, errors="backslashreplace")  # noqa: SIM115
    sys.argv = list(request["argv"])
    sys.path.insert(0, request["path0"])  # the script's folder, or with -m the working folder
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        signal.signal(signum, signal.default_int_handler if signum == signal.SIGINT else signal.SIG_DFL)
    code = 0
    try:
        if request["module"]:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(sys.argv[0], run_name="__main__")
    except SystemExit as exc:  # as the interpreter exits: an int is the status, anything else is printed
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException as exc:  # noqa: BLE001 - the interpreter's own report of an uncaught error
        import traceback

        traceback.print_exc()
        code = 1
        if isinstance(exc, KeyboardInterrupt):  # as Python ends on Ctrl-C: by the signal itself
            sys.stderr.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # as at exit: non-daemon threads joined, then atexit
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
