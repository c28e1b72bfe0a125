"""Which config changes a resumed run accepts.

A resumed run continues the optimizer, sampler and RNG state of the run that wrote the
checkpoint, so it must train the same thing. The rule, checked against the `config.yaml` the
earlier run wrote next to its `checkpoints/` folder:

- keys that only say how long to train, where to write and what to report may change:
  `max_steps`, `resume`, `output_dir`, `logging.*`, `checkpoint.*`, `eval.*`, `distributed.*` (a
  checkpoint loads into any number of processes and either strategy) and `optim.max_nonfinite_in_a_row`;
- every other key (the `policy` section, `algo`, `train` sizes, `optim`, `seed`, `data`,
  `rewards`, `precision`, `cpu`) must keep its value: a change is a `ConfigError` that names
  the changed keys. To train with new values, start a new run in another `output_dir`.

Keys that only one of the two configs has (a key a newer mmrl added or renamed) are not
compared. A checkpoint outside a run directory (no `config.yaml` two levels up) is not checked.
"""

from __future__ import annotations

import os

from omegaconf import OmegaConf

from mmrl.config import Config, ConfigError, migrate, to_yaml

SAFE = ("max_steps", "resume", "output_dir", "logging", "checkpoint", "eval", "distributed",
        "optim.max_nonfinite_in_a_row")


def _flat(node, prefix: str = "") -> dict:
    """Nested mappings -> {dotted key: value}; lists stay whole values."""
    if not isinstance(node, dict):
        return {prefix: node}
    out = {}
    for k, v in node.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _safe(key: str) -> bool:
    return any(key == s or key.startswith(s + ".") for s in SAFE)


def changed_keys(saved: dict, new: dict) -> list[str]:
    """Dotted keys whose values differ between two plain config mappings and that may not change
    across a resume."""
    a, b = _flat(saved), _flat(new)
    return sorted(k for k in a.keys() & b.keys() if a[k] != b[k] and not _safe(k))


def run_config_of(checkpoint_path: str) -> str | None:
    """The `config.yaml` of the run that wrote `run_dir/checkpoints/step_<n>`, if it is there."""
    ckpts = os.path.dirname(os.path.abspath(checkpoint_path))
    path = os.path.join(os.path.dirname(ckpts), "config.yaml")
    return path if os.path.basename(ckpts) == "checkpoints" and os.path.isfile(path) else None


def check_unchanged(checkpoint_path: str, cfg: Config) -> None:
    """Raise `ConfigError` when `cfg` changes a key that decides what is trained (module docstring)."""
    saved_path = run_config_of(checkpoint_path)
    if saved_path is None:
        return
    try:
        saved = migrate(OmegaConf.to_container(OmegaConf.load(saved_path), resolve=True))
    except Exception as e:  # a hand-edited or truncated file
        raise ConfigError(f"cannot read {saved_path!r}, the config of the run being resumed: {e}") from None
    new = OmegaConf.to_container(OmegaConf.create(to_yaml(cfg)), resolve=True)
    changed = changed_keys(saved, new)
    if changed:
        a, b = _flat(saved), _flat(new)
        diffs = "; ".join(f"{k}: {a[k]!r} -> {b[k]!r}" for k in changed[:8])
        more = f" (and {len(changed) - 8} more)" if len(changed) > 8 else ""
        raise ConfigError(f"config key 'resume': {checkpoint_path!r} was trained with another config; changed "
                          f"{', '.join(changed)} ({diffs}{more}), compared with {saved_path!r}. These keys decide "
                          "what is trained and must stay as they were when resuming (only max_steps, logging.*, "
                          "checkpoint.*, eval.*, distributed.* and optim.max_nonfinite_in_a_row may change); put them back, or "
                          "train with the new values in another output_dir")
