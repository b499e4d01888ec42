"""DVC stage `compile`: one engine-bearing .pt2 per method, and the seconds it took (not cached)."""

from __future__ import annotations

from _common import parser as stage_parser
from _common import run, setup


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("toolchain", help="toolchain record (a dependency only)")
    parser.add_argument("out_dir")
    parser.add_argument("timings")
    args = parser.parse_args()
    cfg = setup(args.target)
    from pipeline.files import write_json
    from pipeline.steps import run_compile

    write_json(args.timings, run_compile(cfg, args.out_dir))


if __name__ == "__main__":
    run(main)
