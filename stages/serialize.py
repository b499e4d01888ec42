"""DVC stage `serialize`: write the program directory (<name>.pte, + .ptd, ETRecord) and manifest.json."""

from __future__ import annotations

from _common import run, setup


def main() -> None:
    cfg, layout = setup(__doc__)
    from pipeline.steps.serialize import run_serialize

    run_serialize(cfg, layout.build / "transformed", layout.build / "program", layout.build / "manifest.json")


if __name__ == "__main__":
    run(main, warm=True)
