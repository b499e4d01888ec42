"""What each DVC stage loads before its work, and the toolchain record it loads it for: the stages
`dvc repro` runs every time (`names`, `toolchain`) and `transform` without passes load no torch, Hydra
or ExecuTorch; the compile step loads no ExecuTorch (`bench/dvc_build.py` times them)."""

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config.compose import compose, write_params
from pipeline.engine.toolchain import record

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "executorch", "tensorrt_rtx", "hydra", "omegaconf", "transformers")
# Runs a stage script as DVC would, then prints which of HEAVY it had loaded.
_PROBE = """
import json, runpy, sys
sys.path.insert(0, {stages!r})
sys.argv = [{script!r}]
runpy.run_path({script!r}, run_name="__main__")
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))
"""


def _loaded_by(stage: str, cwd: Path) -> list[str]:
    script = str(ROOT / "stages" / f"{stage}.py")
    code = _PROBE.format(stages=str(ROOT / "stages"), script=script, heavy=HEAVY)
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("stage", ["names", "toolchain", "transform"])
def test_the_light_stages_load_no_library(stage: str, tmp_path: Path) -> None:
    write_params(compose([]), tmp_path / "params.yaml")
    exported = tmp_path / "build" / "mlp" / "exported"
    exported.mkdir(parents=True)
    (exported / "forward.edge").write_bytes(b"edge")
    assert _loaded_by(stage, tmp_path) == []
    if stage == "transform":  # no passes: the exported programs pass through, byte for byte
        assert (tmp_path / "build" / "mlp" / "transformed" / "forward.edge").read_bytes() == b"edge"


def test_a_transform_with_passes_still_runs_them(tmp_path: Path) -> None:
    """The light path is taken only without passes: with one, the stage validates and loads as before
    (here it then finds no Edge program to load, which says it tried)."""
    write_params(compose(["transforms=dead_code"]), tmp_path / "params.yaml")
    (tmp_path / "build" / "mlp" / "exported").mkdir(parents=True)
    result = subprocess.run([sys.executable, str(ROOT / "stages" / "transform.py")], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 2 and "forward.edge cannot be loaded as an Edge program" in result.stderr


def test_the_compile_step_loads_no_executorch() -> None:
    code = "import sys, pipeline.steps.compile; print('executorch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "False", result.stderr[-2000:]


def test_the_toolchain_record_names_what_all_package_metadata_names() -> None:
    """The record reads dist-info folder names, not every package's metadata; it must find the same."""
    want = {}
    for dist in importlib.metadata.distributions():
        name = str(dist.metadata["Name"] or "").lower().replace("-", "_")
        if name.startswith("tensorrt") or name in ("torch", "torchvision", "executorch"):
            want.setdefault(name, dist.version)
    assert any(name.startswith("tensorrt") for name in want)  # not vacuous: a TensorRT flavour is installed
    assert record()["packages"] == dict(sorted(want.items()))


def test_a_params_file_that_is_no_mapping_is_one_line_from_the_first_stage(tmp_path: Path) -> None:
    """A params.yaml that is not a mapping is one line from the first stage, which loads no library."""
    (tmp_path / "params.yaml").write_text("- a list\n")
    shutil.copytree(ROOT / "stages", tmp_path / "stages")
    result = subprocess.run([sys.executable, "stages/names.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2 and result.stderr.startswith("error: params.yaml is not a mapping")
