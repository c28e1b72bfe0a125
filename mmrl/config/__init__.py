"""What a user writes and what checks it: the typed schema (`schema`), the load-time checks (`checks`) and the
policy registry (`policies`). The schema's public names are re-exported here (`from mmrl.config import Config,
load_config`)."""

from mmrl.config.schema import (
                                BECAME_LOSSES,
                                ENV_KEYS,
                                MOVED,
                                RENAMED,
                                SECTIONS,
                                AlgoConfig,
                                CheckpointConfig,
                                Config,
                                ConfigError,
                                DataConfig,
                                DistributedConfig,
                                EnvConfig,
                                EvalConfig,
                                LoggingConfig,
                                OptimConfig,
                                TrainConfig,
                                describe_sections,
                                load_config,
                                migrate,
                                to_yaml,
)

__all__ = ["BECAME_LOSSES", "ENV_KEYS", "MOVED", "RENAMED", "SECTIONS", "AlgoConfig", "CheckpointConfig", "Config", "ConfigError",
           "DataConfig", "DistributedConfig", "EnvConfig", "EvalConfig", "LoggingConfig", "OptimConfig", "TrainConfig",
           "describe_sections", "load_config", "migrate", "to_yaml"]
