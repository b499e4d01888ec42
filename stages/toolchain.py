"""DVC stage `toolchain`: record what engines depend on besides params (always runs, in a fraction
of a second: package metadata only; compile reruns only when the record changes). Inside `dvc exp
run` it first refuses params.yaml that dropped overrides given to `compose`."""

from __future__ import annotations

import argparse

import yaml
from _common import run

from pipeline.config.compose import check_experiment
from pipeline.files import write_json
from pipeline.toolchain import record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    args = parser.parse_args()
    check_experiment()  # composes only inside `dvc exp run`, after `compose` was given overrides
    with open("params.yaml") as f:
        params = yaml.safe_load(f) or {}
    write_json(args.out, record((params.get("compile") or {}).get("target_compute_capabilities") or ()))


if __name__ == "__main__":
    run(main)
