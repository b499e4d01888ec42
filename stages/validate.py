"""DVC stage `validate`: run the .pte against eager PyTorch and write metrics.json."""

from __future__ import annotations

import argparse

from _common import run, setup

from pipeline.steps import run_validate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("program_dir")
    parser.add_argument("metrics")
    args = parser.parse_args()
    run_validate(setup(), args.program_dir, args.metrics)


if __name__ == "__main__":
    run(main)
