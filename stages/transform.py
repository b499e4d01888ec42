"""DVC stage `transform`: apply the configured Edge passes per method. With none configured (the
default) the exported programs are copied through, read from params.yaml as plain data: no torch."""

from __future__ import annotations

from _common import Layout, parser, run, setup

from pipeline.config.params_file import check_plain_names, plain_target, read_plain
from pipeline.steps.transform import configured, pass_through


def main() -> None:
    target = parser(__doc__).parse_args().target
    params = plain_target(read_plain(), target)
    check_plain_names(params, target)
    if not configured((params.get("transforms") or {}).get("passes") or {}, (params.get("model") or {}).get("methods") or {}):
        layout = Layout.of(params, target)
        pass_through(layout.build / "exported", layout.build / "transformed")
        return
    cfg, layout = setup(__doc__)
    from pipeline.steps.transform import run_transform

    run_transform(cfg, layout.build / "exported", layout.build / "transformed")


if __name__ == "__main__":
    run(main)
