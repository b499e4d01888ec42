"""DVC stage `validate`: run the .pte against eager PyTorch; write validation.json (details and
reasons), metrics.json (flat numbers, tracked by git) and plots/build.json."""

from __future__ import annotations

from _common import parser as stage_parser
from _common import run, setup


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("build_dir", help="holds program/ and report.json; gets validation.json")
    parser.add_argument("timings")
    parser.add_argument("metrics")
    parser.add_argument("plot")
    args = parser.parse_args()
    cfg = setup(args.target)
    from pipeline.steps import run_validate

    run_validate(cfg, args.build_dir, args.timings, args.metrics, args.plot)


if __name__ == "__main__":
    run(main)
