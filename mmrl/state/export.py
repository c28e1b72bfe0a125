"""`mmrl export`: a training checkpoint -> a folder the model's own library loads.

    export("runs/x", "out")                          # the newest complete checkpoint of run runs/x
    export("runs/x/checkpoints/step_000004", "out")  # that checkpoint (config: runs/x/config.yaml)
    export("runs/x", "out", ema=True)                # the EMA weights (policy_ema.safetensors)

The policy is rebuilt from the run's config.yaml in this one process on CPU (no process group, no
accelerator, no KL reference), the checkpoint's weights are loaded by `load_weights` (the one place
that knows checkpoint formats), and `policy.export(folder)` writes what transformers / peft /
diffusers load (the adapters document the layout). `mmrl_export.json` records where it came from.
The folder is written under `<out_dir>.tmp-<pid>` and renamed when complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from dataclasses import dataclass

from mmrl.config import Config, ConfigError, load_config
from mmrl.state import checkpoint
from mmrl.types import Exports

MANIFEST = "mmrl_export.json"


@dataclass(frozen=True)
class Source:
    """A checkpoint to export and the run config it was trained with."""

    checkpoint_dir: str
    config_path: str


def resolve_source(source: str) -> Source:
    """A run directory (its newest complete checkpoint) or a checkpoint directory `run/checkpoints/step_N`."""
    if not os.path.isdir(source):
        raise ConfigError(f"export source {source!r} does not exist; pass a run directory (holding config.yaml "
                          "and checkpoints/) or a checkpoint directory run/checkpoints/step_<n>")
    source = os.path.abspath(source)
    if os.path.isfile(os.path.join(source, checkpoint.FILES[0])) or checkpoint.is_sharded(source):  # a checkpoint
        ckpt, run = source, os.path.dirname(os.path.dirname(source))
    else:                                                               # a run folder
        ckpt, run = checkpoint.latest(os.path.join(source, "checkpoints")), source
        if ckpt is None:
            raise ConfigError(f"export source {source!r} holds no complete checkpoint: expected "
                              f"{os.path.join(source, 'checkpoints', 'step_<n>')}/{checkpoint.FILES[0]} (a run writes "
                              "one every checkpoint.every steps and at its last step)")
    config_path = os.path.join(run, "config.yaml")
    if not os.path.isfile(config_path):
        raise ConfigError(f"export source {source!r}: its run's config is missing: expected {config_path!r} (written "
                          "by `mmrl train` into output_dir; a checkpoint folder is output_dir/checkpoints/step_<n>)")
    return Source(ckpt, config_path)


def weights_file(checkpoint_dir: str, ema: bool) -> str:
    """The policy weights file of `checkpoint_dir` (`policy.save` format), checked to exist."""
    name = "policy_ema.safetensors" if ema else checkpoint.FILES[0]
    path = os.path.join(checkpoint_dir, name)
    if not os.path.isfile(path):
        why = (" (its run kept no EMA: train.ema_decay was 0); export without --ema for the trained weights"
               if ema else "")
        raise ConfigError(f"checkpoint {checkpoint_dir!r} holds no {name}{why}")
    return path


def load_weights(checkpoint_dir: str, policy, ema: bool) -> None:
    """Load the trained (or, with `ema`, the averaged) weights of `checkpoint_dir` into `policy`.

    The only place that knows checkpoint formats: one `policy.save` file per checkpoint, or the shards of a
    sharded run (`sharded/`, written by any number of processes; `mmrl.state.dcp`)."""
    from safetensors import SafetensorError

    from mmrl.state import dcp

    check_weights(checkpoint_dir, ema)
    folder = os.path.join(checkpoint_dir, "sharded")
    try:
        if checkpoint.is_sharded(checkpoint_dir):
            dcp.load_weights(folder, policy, ema)
        else:
            policy.load(weights_file(checkpoint_dir, ema))
    except (RuntimeError, ValueError, KeyError, SafetensorError) as e:
        detail = " ".join(str(e).split())[:400]
        raise ConfigError(f"checkpoint {checkpoint_dir!r} does not match the policy of its run's config.yaml: "
                          f"{detail}") from None


def check_weights(checkpoint_dir: str, ema: bool) -> None:
    """That `checkpoint_dir` holds the weights to export (the EMA's with `ema`), in either format."""
    from mmrl.state import dcp

    if not checkpoint.is_sharded(checkpoint_dir):
        weights_file(checkpoint_dir, ema)
    elif ema and not dcp.has_ema(os.path.join(checkpoint_dir, "sharded")):
        raise ConfigError(f"checkpoint {checkpoint_dir!r} holds no EMA weights (its run kept no EMA: "
                          "train.ema_decay was 0); export without --ema for the trained weights")


def build_cpu_policy(cfg: Config, section=None):
    """The run's policy (or the policy `section` of one of its named policies) on CPU in this process: no
    accelerator, no KL reference, no NFT old copy, no env, generation on transformers (the section's `backend`, if
    any, is set to hf)."""
    import torch

    from mmrl.config.policies import BuildContext, build_policy

    torch.manual_seed(cfg.seed)
    section = cfg.policy if section is None else section
    if getattr(section, "backend", "hf") != "hf":   # a generation engine (vLLM) holds no weights worth exporting
        section = dataclasses.replace(section, backend="hf")
    ctx = BuildContext(device=torch.device("cpu"), seed=cfg.seed, output_dir=cfg.output_dir, precision=cfg.precision)
    try:
        return build_policy(section, ctx)
    except ConfigError:
        raise
    except (ValueError, OSError) as e:  # a base model that cannot be found or loaded
        raise ConfigError(f"building policy {section.name!r} for export: {e}") from None


def _check_out_dir(out_dir: str) -> None:
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise ConfigError(f"export output {out_dir!r} exists and is not an empty folder; pass a new folder "
                          "(export never overwrites)")


def _manifest(src: Source, section, ema: bool, name: str) -> dict:
    with open(os.path.join(src.checkpoint_dir, "state.json")) as f:
        step = json.load(f).get("step")
    return {"source": src.checkpoint_dir, "step": step, "ema": ema, "policy": section.name,
            "model": getattr(section, "model", None), "name": name}


def _named(cfg: Config, src: Source, name: str, ema: bool) -> tuple[object, str]:
    """(policy section, weights folder) of policy `name` of the run: 'policy' or a key of its `policies:`."""
    from mmrl.roles import MAIN

    if name == MAIN:
        return cfg.policy, src.checkpoint_dir
    if name not in cfg.policies:
        raise ConfigError(f"export --policy {name!r}: the run has no such policy; its policies: "
                          f"{', '.join([MAIN] + list(cfg.policies))}")
    if ema:
        raise ConfigError(f"export --policy {name!r} --ema: named policies keep no EMA (train.ema_decay is 0 in "
                          "multi-role runs with several policies); export without --ema")
    return cfg.policies[name].policy, checkpoint.member_dir(src.checkpoint_dir, name)


def export(source: str, out_dir: str, *, ema: bool = False, policy: str = "policy") -> str:
    """Export the checkpoint `source` (a run or a checkpoint folder) into the new folder `out_dir`; returns it.
    `policy`: which policy of a multi-role run ('policy', the policy section, or a name from its `policies:`)."""
    out_dir = os.path.abspath(out_dir)
    _check_out_dir(out_dir)
    src = resolve_source(source)
    check_weights(src.checkpoint_dir, ema)                              # fail before building the model
    cfg = load_config(src.config_path, [], saved=True)
    name = policy
    section, weights_dir = _named(cfg, src, name, ema)
    check_weights(weights_dir, ema)
    policy = build_cpu_policy(cfg, section)
    if not isinstance(policy, Exports):
        raise ConfigError(f"policy {type(policy).__name__} has no library export; `mmrl export` writes folders of "
                          "the vlm and diffusion policies (its weights are the checkpoint's policy.safetensors)")
    load_weights(weights_dir, policy, ema)
    tmp = f"{out_dir}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        os.makedirs(tmp)
        policy.export(tmp)
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(_manifest(src, section, ema, name), f, indent=1)
        if os.path.isdir(out_dir):
            os.rmdir(out_dir)                                          # empty (checked above)
        os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir
