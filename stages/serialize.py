"""DVC stage `serialize`: write the program directory (<name>.pte, + .ptd, ETRecord) and manifest.json."""

from __future__ import annotations

import argparse

from _common import run, setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("in_dir")
    parser.add_argument("program_dir")
    parser.add_argument("manifest")
    args = parser.parse_args()
    cfg = setup()
    from pipeline.steps import run_serialize

    run_serialize(cfg, args.in_dir, args.program_dir, args.manifest)


if __name__ == "__main__":
    run(main)
