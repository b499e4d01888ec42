"""Hydra discovers this module when it scans for plugins (DVC's `dvc exp run` does, with the repo
root as plugins path), so DVC's own composition of `conf/` finds the pipeline's schemas."""

from pipeline.config.schema import register_configs

register_configs()
