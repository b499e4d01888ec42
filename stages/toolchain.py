"""DVC stage `toolchain`: record what engines depend on besides params (always runs: package
metadata, and the digests of the files `model.weights` names, read in full; compile reruns only when
the record changes, so a changed checkpoint rebuilds and a touched one does not; fp8 calibration files
likewise). Inside `dvc exp run`, which composes params.yaml itself, it first validates that params.yaml
and refuses one that dropped overrides given to `compose`; otherwise it loads no config library."""

from __future__ import annotations

import os

from _common import Layout, parser, run

from pipeline.config.params_file import check_plain_names, plain_target, read_plain
from pipeline.engine import toolchain_key
from pipeline.engine.toolchain import WEIGHTS, calibration_digests, calibration_files, record
from pipeline.files import write_json
from pipeline.models.weight_files import digests, weight_files


def main() -> None:
    args = parser(__doc__).parse_args()
    if os.environ.get("DVC_EXP_NAME"):
        from pipeline.config.compose import check_experiment

        check_experiment(target=args.target)
    cfg = plain_target(read_plain(), args.target)
    check_plain_names(cfg, args.target)  # the layout's names, before anything is written
    compile_section = cfg.get("compile") or {}
    out = Layout.of(cfg, args.target).build / "toolchain.json"
    weights = (cfg.get("model") or {}).get("weights")
    stage = os.environ.get("DVC_STAGE")
    files = toolchain_key.sources([*((weights, *weight_files(weights)) if weights else ()),
                                   *calibration_files(compile_section)])
    made_under = toolchain_key.key(files) if stage and not os.environ.get("DVC_EXP_NAME") else None
    toolchain = record(compile_section.get("target_compute_capabilities") or ())
    if weights:
        toolchain[WEIGHTS] = digests(weights)
    calibration = calibration_digests(compile_section)
    if calibration:
        toolchain["calibration"] = calibration
    write_json(out, toolchain)
    if stage:
        toolchain_key.keep(stage, files, made_under, out)
    else:
        print(f"wrote {out}")


if __name__ == "__main__":
    run(main)
