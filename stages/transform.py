"""DVC stage `transform`: apply the configured Edge passes per method."""

from __future__ import annotations

from _common import parser as stage_parser
from _common import run, setup


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("in_dir")
    parser.add_argument("out_dir")
    args = parser.parse_args()
    cfg = setup(args.target)
    from pipeline.steps import run_transform

    run_transform(cfg, args.in_dir, args.out_dir)


if __name__ == "__main__":
    run(main)
