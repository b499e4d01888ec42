"""DVC stage `toolchain`: record what engines depend on besides params (always runs, in a fraction
of a second: package metadata only; compile reruns only when the record changes). Inside `dvc exp
run` it first refuses params.yaml that dropped overrides given to `compose`."""

from __future__ import annotations

import yaml
from _common import parser as stage_parser
from _common import run

from pipeline.config.compose import check_experiment, target_config
from pipeline.files import write_json
from pipeline.toolchain import record


def main() -> None:
    parser = stage_parser(__doc__)
    parser.add_argument("out")
    args = parser.parse_args()
    check_experiment()  # composes only inside `dvc exp run`, after `compose` was given overrides
    with open("params.yaml") as f:
        params = yaml.safe_load(f) or {}
    compile_section = target_config(params, args.target).get("compile") or {}
    write_json(args.out, record(compile_section.get("target_compute_capabilities") or ()))


if __name__ == "__main__":
    run(main)
