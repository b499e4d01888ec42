"""Time a no-op `dvc repro` (target: under 3 s on the 2-core CI machine) against `dvc status`, in a
temporary copy of the project built once with the default config.

    python -m bench.dvc_noop [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ITEMS = ("conf", "stages", "pipeline", "hydra_plugins", "dvc.yaml", "params.yaml", ".dvcignore", ".gitignore")


def _run(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, env={**os.environ, "DVC_NO_ANALYTICS": "1"})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        for item in ITEMS:
            src = ROOT / item
            (shutil.copytree(src, repo / item, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
             else shutil.copy(src, repo / item))
        _run(["git", "init", "-q"], repo)
        _run(["dvc", "init", "-q"], repo)
        print(f"first dvc repro (full build): {_run(['dvc', 'repro'], repo):.1f} s")
        noop = [_run(["dvc", "repro"], repo) for _ in range(args.repeats)]
        status = [_run(["dvc", "status"], repo) for _ in range(args.repeats)]
        print(f"no-op dvc repro: median {statistics.median(noop):.2f} s (runs: {', '.join(f'{t:.2f}' for t in noop)})")
        print(f"dvc status:      median {statistics.median(status):.2f} s; ratio {statistics.median(noop) / statistics.median(status):.2f}")


if __name__ == "__main__":
    main()
