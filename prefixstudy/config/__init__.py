"""The one validated study config: parsed once, resolved, saved beside the results.

``schema`` holds the model (``StudyConfig``, its ``engine`` a union over the registered backends),
``sections`` its other sections, ``load`` the reading of YAML and ``--set`` overrides, and
``arm_checks`` the checks of the arms against the engine that validation alone cannot make."""

from __future__ import annotations

from prefixstudy.config.load import (CONFIG_MAX_BYTES, CONFIG_MAX_VALUES, DATASET_MAX_TOKENS, check_sizes, dump_config,
                                     flat_config, load_config, parse_config, read_yaml, resolve_model_path, set_dotted)
from prefixstudy.config.schema import ENGINE_KINDS, EngineConfig, StudyConfig
from prefixstudy.config.sections import (ArrivalConfig, CheckConfig, DatasetConfig, RayConfig, RouterConfig,
                                         SweepConfig)

__all__ = ["CONFIG_MAX_BYTES", "CONFIG_MAX_VALUES", "DATASET_MAX_TOKENS", "ENGINE_KINDS", "ArrivalConfig",
           "CheckConfig", "DatasetConfig", "EngineConfig", "RayConfig", "RouterConfig", "StudyConfig", "SweepConfig",
           "check_sizes", "dump_config", "flat_config", "load_config", "parse_config", "read_yaml",
           "resolve_model_path", "set_dotted"]
