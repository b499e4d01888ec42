"""DVC stage `compile`: one engine-bearing .pt2 per method."""

from __future__ import annotations

import argparse

from _common import run, setup

from pipeline.steps import run_compile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("toolchain", help="toolchain record (a dependency only)")
    parser.add_argument("out_dir")
    args = parser.parse_args()
    run_compile(setup(), args.out_dir)


if __name__ == "__main__":
    run(main)
