"""`python -m pipeline.coverage`: lower the coverage suite (or a slice of it) on this machine and
write `<out>/coverage-<precision>.md` and `.json`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from pipeline.cli import reported
from pipeline.coverage.run import run_suite, suite_config, summary
from pipeline.coverage.suite import select
from pipeline.engine.compile_spec import PRECISIONS
from pipeline.errors import ConfigError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.coverage", description=__doc__)
    parser.add_argument("models", nargs="*", help="suite names (timm/resnet50) or prefixes (hf/), or any timm architecture "
                        "(held-out models); default: the slice")
    parser.add_argument("--slice", default="all", help="all, fast (the CI slice), or one source: torchvision, "
                        "torchvision-segmentation, timm, hf, hf-decoder, speech")
    parser.add_argument("--precision", default="fp32", choices=PRECISIONS)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="models built at once (default: cores)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds one model may take")
    parser.add_argument("--out", type=Path, default=Path("build/coverage"))
    parser.add_argument("--keep", action="store_true", help="keep every .pte under <out>/programs/")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override of every build, e.g. compile.optimization_level=5 (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    with reported():
        if args.jobs < 1 or not 0 < args.timeout < float("inf"):
            raise ConfigError(f"--jobs {args.jobs} --timeout {args.timeout}: give at least one job and a positive, "
                              "finite timeout")
        entries = select(args.models or None, args.slice)
        suite_config(args.precision, args.overrides)
    rows = run_suite(entries, args.precision, args.out, args.jobs, args.timeout, args.keep, overrides=args.overrides)
    s = summary(rows)
    print(f"{s['lowered_whole']}/{s['models']} lowered whole ({s['lowered_whole_pct']} %), {s['failed']} failed; "
          f"table: {args.out / f'coverage-{args.precision}.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
