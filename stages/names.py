"""DVC stage `names`: check the names that become paths (the model's, each build target's) before
any stage whose outputs they name runs: DVC removes a stage's outputs before running it, so a name
such as `..` would have it delete files outside `build/` (`build/../toolchain.json`) before the stage
could refuse it. Writes `build/names.json`, the build folder of each name (no torch: milliseconds)."""

from __future__ import annotations

import yaml
from _common import Layout, parser, run

from pipeline.config.compose import check_params_file, target_config
from pipeline.config.validate import check_plain_names
from pipeline.files import write_json


def main() -> None:
    parser(__doc__).parse_args()
    check_params_file()
    with open("params.yaml") as f:
        params = yaml.safe_load(f) or {}
    if not isinstance(params, dict):
        check_plain_names({}, None)  # one line: params.yaml holds no model name
    check_plain_names(params, None)
    folders = {"model": str(Layout.of(params, None).build), "targets": {}}
    for key in params.get("targets") or {}:
        check_plain_names(target_config(params, str(key)), str(key))
        folders["targets"][str(key)] = str(Layout.of(params, str(key)).build)
    write_json("build/names.json", folders)


if __name__ == "__main__":
    run(main)
