"""DVC stage `validate`: run the .pte against eager PyTorch; write validation.json (details and
reasons), metrics.json (flat numbers, tracked by git) and plots/build.json."""

from __future__ import annotations

from _common import run, setup


def main() -> None:
    cfg, layout = setup(__doc__)
    from pipeline.steps.validate import run_validate

    run_validate(cfg, layout.build, layout.timings, layout.metrics, layout.plot)


if __name__ == "__main__":
    run(main, warm=True)
