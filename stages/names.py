"""DVC stage `names`: check the names that become paths (the model's, each build target's) before
any stage whose outputs they name runs: DVC removes a stage's outputs before running it, so a name
such as `..` would have it delete files outside `build/` (`build/../toolchain.json`) before the stage
could refuse it. Writes `build/names.json`, the build folder of each name (no torch: milliseconds)."""

from __future__ import annotations

from _common import Layout, parser, run

from pipeline.config.params_file import check_plain_names, plain_target, read_plain, target_names
from pipeline.files import write_json


def main() -> None:
    parser(__doc__).parse_args()
    params = read_plain()
    check_plain_names(params, None)
    folders = {"model": str(Layout.of(params, None).build), "targets": {}}
    for key in target_names(params):
        check_plain_names(plain_target(params, key), key)
        folders["targets"][key] = str(Layout.of(params, key).build)
    write_json("build/names.json", folders)


if __name__ == "__main__":
    run(main)
