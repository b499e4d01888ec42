"""The part of the environment an engine keeps: `NVIDIA_TF32_OVERRIDE` where it was built.

TensorRT-RTX writes the variable's value at build into the engine (an engine built on the CPU with
`NVIDIA_TF32_OVERRIDE=0` differs from one built without it, byte for byte) and makes an execution
context only where the variable has the same value: an engine built without it and run with
`NVIDIA_TF32_OVERRIDE=0` gets "Inconsistent setting of NVIDIA_TF32_OVERRIDE env var at build -1 and
at execution 0" and no context (the H200, 2026-12-01, `results/gpu-log.md`). With the variable at 0
in both places the engine computes in strict fp32 (about 5x slower); it is the one way to switch
TF32 off: the builder's TF32 flag changes nothing (a convolution's error against float64 is 3.2e-4
with the flag set or cleared, 5.8e-6 under the variable; the H200, 2026-12-01), so
`compile.allow_tf32=false` is refused where the variable is not 0 (`require_tf32_off`).

So the value is part of what an engine depends on (the toolchain record, the engine cache key),
the blob records it (`BlobMetadata.tf32_override`), and the runtime compares it here before it asks
TensorRT for a context.
"""

from __future__ import annotations

import os

from pipeline.errors import CompileSpecError, RuntimeUnavailableError

VARIABLE = "NVIDIA_TF32_OVERRIDE"


def current() -> str:
    """The variable's value in this process; "" when it is not set."""
    return os.environ.get(VARIABLE, "")


def setting() -> dict[str, str]:
    """The variable as a toolchain record keeps it: {VARIABLE: value} where set, else nothing (so
    records written before it was read stay equal)."""
    here = current()
    return {VARIABLE: here} if here else {}


def require_tf32_off(setting: str) -> None:
    """Refuse `setting` (a compile option asking for fp32 without TF32, named for the message) unless
    this process has the variable at 0: TensorRT-RTX would build a TF32 engine all the same.

    Raises:
        CompileSpecError: one line naming the variable and both fixes.
    """
    if current() != "0":
        raise CompileSpecError(
            f"{setting}: TensorRT-RTX ignores the TF32 builder flag (its fp32 convolutions stay TF32); only "
            f"{VARIABLE}=0 switches TF32 off: build and run the program with {VARIABLE}=0 (now {_said(current())}), "
            "or leave allow_tf32 true"
        )


def check(recorded: str | None, engine: str) -> None:
    """Refuse to run `engine` (a name for the message) in a process whose `NVIDIA_TF32_OVERRIDE`
    differs from the `recorded` build value (None: not recorded, an older blob; nothing to check).

    Raises:
        RuntimeUnavailableError: one line naming both values and both fixes.
    """
    here = current()
    if recorded is None or recorded == here:
        return
    rebuild = f"rebuild the program with {VARIABLE}={here}" if here else f"rebuild it without {VARIABLE}"
    raise RuntimeUnavailableError(
        f"{engine} was built with {_said(recorded)} and this process has {_said(here)}; TensorRT-RTX runs an engine "
        f"only under the {VARIABLE} it was built with: {'unset it' if not recorded else f'set {VARIABLE}={recorded}'} "
        f"here, or {rebuild}"
    )


def _said(value: str) -> str:
    return f"{VARIABLE}={value}" if value else f"{VARIABLE} unset"
