"""How the steps say what they do: a line when each starts and ends, with its seconds."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

log = logging.getLogger("pipeline")


@contextmanager
def step(what: str) -> Iterator[Callable[[], float]]:
    """Log when `what` starts and when it ends, with its seconds (also handed to the block)."""
    start = time.perf_counter()
    log.info("%s ...", what)
    elapsed = [0.0]
    yield lambda: elapsed[0]
    elapsed[0] = time.perf_counter() - start
    log.info("%s done in %.1f s", what, elapsed[0])
