"""DVC stage `toolchain`: record what engines depend on besides params (always runs; compile reruns
only when the record changes)."""

from __future__ import annotations

import argparse

from _common import run, setup

from pipeline.files import write_json
from pipeline.steps import toolchain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    args = parser.parse_args()
    write_json(args.out, toolchain(setup()))


if __name__ == "__main__":
    run(main)
