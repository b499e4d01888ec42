"""DVC stage `export`: lower compiled methods (TensorRT first, then the chain) to Edge programs."""

from __future__ import annotations

from _common import run, setup


def main() -> None:
    cfg, layout = setup(__doc__)
    from pipeline.steps.export import run_export

    run_export(cfg, layout.build / "compiled", layout.build / "exported", layout.build / "report.json")


if __name__ == "__main__":
    run(main, warm=True)
