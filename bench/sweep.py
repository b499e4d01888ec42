"""Sweeps at scale on this machine: one Hydra multirun of models x precisions x optimization levels,
run cold (empty engine cache) and again (warm), with the basic launcher (jobs one after another),
the joblib launcher (parallel jobs) and the Ray launcher (a local cluster that this script starts
with `ray start --head` and stops). Prints wall seconds, engines built and engines taken from the
cache per sweep, from each sweep's summary table.

    python -m bench.sweep                                   # 2 models x 2 precisions x 3 levels = 12 jobs
    python -m bench.sweep --models mlp --levels 1           # a quick look
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAUNCHERS = {
    "basic": [],
    "joblib": ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"],
    "ray": ["hydra/launcher=ray_cluster"],
}


def sweep(name: str, launcher: str, axes: list[str], cache: Path, out: Path) -> dict[str, Any]:
    """Run one multirun; its wall seconds and totals from its summary."""
    cmd = [sys.executable, "-m", "pipeline", "-m", *LAUNCHERS[launcher], *axes, f"cache.url={cache}",
           f"hydra.sweep.dir={out / name}"]
    start = time.perf_counter()
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"sweep {name} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    table = json.loads((out / name / "summary.json").read_text())
    hits = sum(int(r.get("cache_hits", 0)) for r in table)
    lookups = sum(int(r.get("engines", 0)) for r in table)
    return {"sweep": name, "launcher": launcher, "jobs": len(table), "failed": sum(r["status"] != "done" for r in table),
            "wall_s": round(seconds, 1), "engines_built": lookups - hits, "engines_from_cache": hits}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "tiny_decoder"])
    parser.add_argument("--precisions", nargs="+", default=["fp32", "fp16"])
    parser.add_argument("--levels", nargs="+", default=["1", "2", "3"])
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    axes = [f"model={','.join(args.models)}", f"compile.precision={','.join(args.precisions)}",
            f"compile.optimization_level={','.join(args.levels)}"]
    out = Path(tempfile.mkdtemp(prefix="sweep-bench-"))
    rows = [sweep("basic-cold", "basic", axes, out / "cache-basic", out),
            sweep("basic-warm", "basic", axes, out / "cache-basic", out),
            sweep("joblib-cold", "joblib", axes, out / "cache-joblib", out),
            sweep("joblib-warm", "joblib", axes, out / "cache-joblib", out)]
    ray = shutil.which("ray")
    if ray and not args.no_ray:
        subprocess.run([ray, "start", "--head", "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
                        f"--temp-dir={out / 'ray'}"], check=True, capture_output=True)
        try:
            rows += [sweep("ray-cold", "ray", axes, out / "cache-ray", out),
                     sweep("ray-warm", "ray", axes, out / "cache-ray", out)]
        finally:
            subprocess.run([ray, "stop", "--force"], capture_output=True)
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(str(r[c]) for c in cols) + " |")
    print(f"(sweep directories under {out})")


if __name__ == "__main__":
    main()
