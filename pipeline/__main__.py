"""`python -m pipeline [OVERRIDES]`: the Hydra app that runs compile, export, transform,
serialize and validate in-process for one composed config, writing into Hydra's run directory;
`python -m pipeline -m compile.precision=fp32,fp16 model=mlp,resnet18` sweeps with multirun.

Before Hydra starts, arguments that would name code and malformed YAML are refused and every
value a sweep takes is composed and checked (`pipeline.cli.job_overrides`), its weight files
included; the run
directory is claimed by `pipeline.run_dir.RunDirGuard` (see `conf/config.yaml`); outputs move into
it only when complete. Errors are one line (`PIPELINE_DEBUG=1` for tracebacks)."""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from pipeline.cli import check_arguments, check_yaml, job_overrides, reported
from pipeline.config.compose import CONF_DIR, check_files, compose, typed
from pipeline.config.schema import register_configs
from pipeline.config.validate import validate
from pipeline.files import write_json
from pipeline.run_dir import staged
from pipeline.sweep import objective

log = logging.getLogger("pipeline")


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    """Build one config into the run directory; return the autotune objective (`sweep.objective`)."""
    out = Path(HydraConfig.get().runtime.output_dir)
    log.info("building %s (%s) into %s", cfg.model.name, cfg.compile.precision, out)
    from pipeline.steps import run_all  # torch and ExecuTorch load here, after the first line

    with reported():
        validate(cfg)
        config = typed(cfg)
        with staged(out) as tmp:
            files = run_all(config, tmp, validate=True)
            write_json(tmp / "params.json", asdict(config))
            metrics = json.loads(files["metrics"].read_text())
        log.info("wrote %s", ", ".join(str(out / p.relative_to(tmp)) for p in files.values()))
    return objective(metrics)


def cli() -> None:
    """Check the command line, `conf/` and the config of every value a sweep takes (one line each,
    before Hydra starts), then run the Hydra app."""
    with reported():
        check_arguments(sys.argv[1:])
        check_yaml(CONF_DIR)
        register_configs()
        for overrides in job_overrides(sys.argv[1:]) or []:
            check_files(compose(overrides))  # the files a job reads are there and of a known kind
    main()


if __name__ == "__main__":
    cli()
