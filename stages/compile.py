"""DVC stage `compile`: one engine-bearing .pt2 per method, and the seconds it took (not cached)."""

from __future__ import annotations

from _common import run, setup


def main() -> None:
    cfg, layout = setup(__doc__)
    import json

    from pipeline.engine.toolchain import WEIGHTS
    from pipeline.files import write_json
    from pipeline.steps.compile import run_compile

    recorded = json.loads((layout.build / "toolchain.json").read_text()).get(WEIGHTS)
    write_json(layout.timings, run_compile(cfg, layout.build / "compiled", recorded))


if __name__ == "__main__":
    run(main, warm=True)
