"""DVC stage `toolchain`: record what engines depend on besides params (always runs: package
metadata, and the digests of the files `model.weights` names, read in full; compile reruns only when
the record changes, so a changed checkpoint rebuilds and a touched one does not; fp8 calibration files
likewise). Inside `dvc exp run` it first refuses params.yaml that dropped overrides given to `compose`."""

from __future__ import annotations

import os

import yaml
from _common import Layout, parser, run

from pipeline.config.compose import check_experiment, check_params_file, target_config
from pipeline.config.validate import check_plain_names
from pipeline.engine import calibration
from pipeline.engine.toolchain import WEIGHTS, record
from pipeline.files import write_json


def main() -> None:
    args = parser(__doc__).parse_args()
    check_experiment()  # composes only inside `dvc exp run`, after `compose` was given overrides
    check_params_file()
    with open("params.yaml") as f:
        params = yaml.safe_load(f) or {}
    cfg = target_config(params, args.target)
    check_plain_names(cfg, args.target)  # the layout's names, before anything is written
    compile_section = cfg.get("compile") or {}
    out = Layout.of(cfg, args.target).build / "toolchain.json"
    toolchain = record(compile_section.get("target_compute_capabilities") or ())
    weights = (cfg.get("model") or {}).get("weights")
    if weights:
        from pipeline.models.checkpoint import digests

        toolchain[WEIGHTS] = digests(weights)
    calibration_files = calibration.digests(compile_section)
    if calibration_files:
        toolchain["calibration"] = calibration_files
    write_json(out, toolchain)
    if not os.environ.get("DVC_STAGE"):
        print(f"wrote {out}")


if __name__ == "__main__":
    run(main)
