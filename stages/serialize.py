"""DVC stage `serialize`: write the program directory (<name>.pte, + .ptd, ETRecord) and manifest.json."""

from __future__ import annotations

from _common import parser as stage_parser
from _common import run, setup


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("in_dir")
    parser.add_argument("program_dir")
    parser.add_argument("manifest")
    args = parser.parse_args()
    cfg = setup(args.target)
    from pipeline.steps import run_serialize

    run_serialize(cfg, args.in_dir, args.program_dir, args.manifest)


if __name__ == "__main__":
    run(main)
