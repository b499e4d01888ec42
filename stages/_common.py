"""Shared entry-point plumbing for stage scripts: logging and reading params.yaml."""

from __future__ import annotations

import logging
from typing import Any

from pipeline.config.compose import read_params


def setup() -> dict[str, Any]:
    """Configure progress logging and return the validated params."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    return read_params("params.yaml")
