"""DVC stage `compile`: one engine-bearing .pt2 per method, and the seconds it took (not cached)."""

from __future__ import annotations

import argparse

from _common import run, setup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("toolchain", help="toolchain record (a dependency only)")
    parser.add_argument("out_dir")
    parser.add_argument("timings")
    args = parser.parse_args()
    cfg = setup()
    from pipeline.files import write_json
    from pipeline.steps import run_compile

    write_json(args.timings, run_compile(cfg, args.out_dir))


if __name__ == "__main__":
    run(main)
