"""DVC stage `export`: lower compiled methods (TensorRT first, then the chain) to Edge programs."""

from __future__ import annotations

from _common import parser as stage_parser
from _common import run, setup


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("compiled")
    parser.add_argument("out_dir")
    parser.add_argument("report")
    args = parser.parse_args()
    cfg = setup(args.target)
    from pipeline.steps import run_export

    run_export(cfg, args.compiled, args.out_dir, args.report)


if __name__ == "__main__":
    run(main)
