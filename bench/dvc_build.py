"""The DVC loop against the in-process build, on this machine's CPU, in a temporary copy of the project:
per model, `python -m pipeline` against `python -m pipeline.config.compose && dvc repro` (engine cache
off in both; the stage server started cold), each stage's wall seconds run by itself as DVC runs it and
in an interpreter of its own (with its seconds importing), then a no-op `dvc repro` against `dvc status`
(the always-run toolchain stage copying its kept record back, `stages/toolchain.sh`; and the same no-op
with that stage's command a bare `cp` of its record: DVC's own floor).
Targets (issue 55): the MLP within 2x, ResNet-18 within 1.5x, the no-op within 1.5x.

    python -m bench.dvc_build [--models mlp resnet18] [--repeats 5] [--out results/dvc-build.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ITEMS = ("conf", "stages", "pipeline", "hydra_plugins", "dvc.yaml", ".dvcignore", ".gitignore")
STAGES = ("names", "toolchain", "compile", "export", "transform", "serialize", "validate")
_ENV = {**os.environ, "DVC_NO_ANALYTICS": "1"}
_IMPORT = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| {1,2}(\S+)$")  # top-level imports only


def _run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env or _ENV)
    took = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return took, done.stderr


def _stage(repo: Path, stage: str, env: dict[str, str]) -> dict[str, float]:
    """One stage run by itself (its outputs rewritten the same): wall seconds as DVC runs it (in a fork
    of the warm stage server the repro left), and in an interpreter of its own, with its seconds importing."""
    env = {k: v for k, v in env.items() if k != "DVC_STAGE"}
    warm, _ = _run([sys.executable, f"stages/{stage}.py"], repo, env)
    cold_env = env | {"PYTHONPROFILEIMPORTTIME": "1", "PIPELINE_STAGE_SERVER": "off"}
    cold, err = _run([sys.executable, f"stages/{stage}.py"], repo, cold_env)
    imports = sum(int(m.group(1)) for line in err.splitlines() if (m := _IMPORT.match(line))) / 1e6
    return {"wall_s": round(warm, 2), "own_interpreter_s": round(cold, 2), "import_s": round(imports, 2)}


def _model(repo: Path, model: str) -> dict[str, Any]:
    inproc, _ = _run([sys.executable, "-m", "pipeline", f"model={model}", "cache=off",
                      f"hydra.run.dir={repo / 'inproc' / model}"], repo)
    env = _ENV | {"BENCH_DVC_BUILD": model}  # a key of its own: the DVC loop starts its stage server cold
    compose, _ = _run([sys.executable, "-m", "pipeline.config.compose", f"model={model}", "cache=off"], repo, env)
    repro, _ = _run(["dvc", "repro"], repo, env)
    stages = {s: _stage(repo, s, env) for s in STAGES}
    dvc = compose + repro
    return {"in_process_s": round(inproc, 2), "compose_s": round(compose, 2), "dvc_repro_s": round(repro, 2),
            "dvc_s": round(dvc, 2), "ratio": round(dvc / inproc, 2), "stages": stages}


def _noop(repo: Path, model: str, repeats: int) -> dict[str, Any]:
    _run(["dvc", "repro"], repo)  # what the stage runs above left as it was
    noop, status = [], []
    for _ in range(repeats):  # interleaved: both see the same machine load
        noop.append(_run(["dvc", "repro"], repo)[0])
        status.append(_run(["dvc", "status"], repo)[0])
    med_noop, med_status = statistics.median(noop), statistics.median(status)
    # The floor: the same no-op with the always-run toolchain stage's command no Python (a copy of the
    # record it writes: DVC removes a stage's outputs before running it).
    dvc_yaml = repo / "stages" / "dvc.yaml"  # the always-run stages' file
    kept = dvc_yaml.read_text()
    record = Path("build") / model / "toolchain.json"
    shutil.copy(repo / record, repo / "toolchain.keep")
    dvc_yaml.write_text(kept.replace("cmd: sh stages/toolchain.sh", f"cmd: cp toolchain.keep {record}", 1))
    _run(["dvc", "repro"], repo)
    floor = [_run(["dvc", "repro"], repo)[0] for _ in range(repeats)]
    dvc_yaml.write_text(kept)
    return {"noop_s": round(med_noop, 2), "status_s": round(med_status, 2), "ratio": round(med_noop / med_status, 2),
            "noop_runs": [round(t, 2) for t in noop], "status_runs": [round(t, 2) for t in status],
            "toolchain_cp_s": round(statistics.median(floor), 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mlp", "resnet18"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, help="write the results as JSON here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        for item in ITEMS:
            src = ROOT / item
            (shutil.copytree(src, repo / item, ignore=shutil.ignore_patterns("__pycache__")) if src.is_dir()
             else shutil.copy(src, repo / item))
        _run(["git", "init", "-q"], repo)
        _run(["dvc", "init", "-q"], repo)
        _run([sys.executable, "-c", "import executorch.exir, torchvision"], repo)  # a warm page cache for both
        models = {m: _model(repo, m) for m in args.models}
        result = {"date": datetime.date.today().isoformat(), "machine": f"{platform.machine()}, {os.cpu_count()} cores (CPU)",
                  "command": "python -m bench.dvc_build " + " ".join(sys.argv[1:]), "models": models,
                  "noop": _noop(repo, args.models[-1], args.repeats)}
    for model, r in models.items():
        print(f"{model}: in-process {r['in_process_s']:.1f} s, compose + dvc repro {r['dvc_s']:.1f} s: {r['ratio']:.2f}x")
        print("  stage by stage, warm server (own interpreter, of it importing): " + ", ".join(
            f"{s} {v['wall_s']:.1f} s ({v['own_interpreter_s']:.1f}, {v['import_s']:.1f})" for s, v in r["stages"].items()))
    n = result["noop"]
    print(f"no-op dvc repro {n['noop_s']:.2f} s, dvc status {n['status_s']:.2f} s: {n['ratio']:.2f}x; with the toolchain "
          f"stage's command a cp {n['toolchain_cp_s']:.2f} s")
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
