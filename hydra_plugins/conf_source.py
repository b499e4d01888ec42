"""Config groups only from their folders. Hydra reads every `file://` folder of its search path
(`conf/`, and any a searchpath adds) through `InsideFileConfigSource`: Hydra's file config source
with every path it loads, lists or tests kept inside that folder. A group option is the name of a file
in its group's folder, never a path out of it: `model=../../../x` composed a file from anywhere
through `dvc exp run -S`, where the pipeline's own argument check (`cli.check_arguments`) never
runs. Hydra finds both classes when it scans `hydra_plugins` (DVC scans the repository root; a
process started there, `python -m pipeline` included, does too)."""

from __future__ import annotations

import os

from hydra._internal.core_plugins import file_config_source as _file
from hydra.core.config_search_path import ConfigSearchPath
from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult
from hydra.plugins.search_path_plugin import SearchPathPlugin

SCHEME = "pipeline-file"


class InsideFileConfigSource(_file.FileConfigSource):
    @staticmethod
    def scheme() -> str:
        return SCHEME

    def _inside(self, config_path: str) -> bool:
        root = os.path.realpath(self.path)
        full = os.path.realpath(os.path.join(self.path, config_path))
        return full == root or full.startswith(root + os.sep)

    def load_config(self, config_path: str) -> ConfigResult:
        if not self._inside(self._normalize_file_name(config_path)):
            raise ConfigLoadError(f"config {config_path!r} lies outside {self.path}: a config group option is the name "
                                  "of a file in its group's folder, not a path")
        return super().load_config(config_path)

    def is_group(self, config_path: str) -> bool:
        return self._inside(config_path) and super().is_group(config_path)

    def is_config(self, config_path: str) -> bool:
        return self._inside(self._normalize_file_name(config_path)) and super().is_config(config_path)

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        return super().list(config_path, results_filter) if self._inside(config_path) else []


class InsideSearchPath(SearchPathPlugin):
    """Every `file://` folder of the search path read through `InsideFileConfigSource`."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        for element in search_path.get_path():
            if element.path.startswith("file://") or "://" not in element.path:  # a bare folder is a file:// one
                element.path = f"{SCHEME}://{element.path.removeprefix('file://')}"
