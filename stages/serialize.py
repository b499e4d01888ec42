"""DVC stage `serialize`: write <name>.pte (+ .ptd) and manifest.json."""

from __future__ import annotations

import argparse

from _common import setup

from pipeline.steps import run_serialize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("in_dir")
    parser.add_argument("out_dir")
    args = parser.parse_args()
    run_serialize(setup(), args.in_dir, args.out_dir)


if __name__ == "__main__":
    main()
