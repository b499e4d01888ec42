"""`python -m pipeline [OVERRIDES]`: the Hydra app that runs compile, export, transform,
serialize and validate in-process for one composed config, writing into Hydra's run directory;
`python -m pipeline -m compile.precision=fp32,fp16 model=mlp,resnet18` sweeps with multirun."""

from __future__ import annotations

import logging

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from pipeline.config.compose import CONF_DIR
from pipeline.config.schema import register_configs
from pipeline.config.validate import validate
from pipeline.steps import run_all, write_json

log = logging.getLogger("pipeline")
register_configs()


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Build one config into the run directory."""
    validate(cfg)
    out = HydraConfig.get().runtime.output_dir
    container = OmegaConf.to_container(cfg, resolve=True)
    files = run_all(container, out, validate=True)  # type: ignore[arg-type]
    write_json(f"{out}/params.json", container)
    log.info("wrote %s", ", ".join(str(p) for p in files.values()))


if __name__ == "__main__":
    main()
