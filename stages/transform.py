"""DVC stage `transform`: apply the configured Edge passes per method."""

from __future__ import annotations

from _common import run, setup


def main() -> None:
    cfg, layout = setup(__doc__)
    from pipeline.steps import run_transform

    run_transform(cfg, layout.build / "exported", layout.build / "transformed")


if __name__ == "__main__":
    run(main)
