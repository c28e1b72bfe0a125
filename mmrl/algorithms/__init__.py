"""The step math, one algorithm per file: advantage estimators and reward combination (`advantages`), group
filters (`filtering`), turn-level credit (`credit`), policy losses (`policy_losses/`, one file per loss),
objectives (`objectives/`: the policy gradient, DiffusionNFT), aggregation, KL and entropy (`losses`),
GRPO-Guard's terms (`guard`) and the rollout correction (`rollout_correction`). Each module registers its choices
in a `Registry` that the config checks, `--help` and the errors list."""
