"""Sampling does not depend on the number of processes: the first step of the tiny VLM, SD3 and agent
configs, run in 1 process and in 2 (torchrun, gloo on CPU), samples the same completions, images and
multi-turn trajectories.

Only rank 0 writes samples (its own prompts: the first half of the step's); the other rank's samples
enter through `reward/mean`, averaged over processes, and a reward that hashes each output, so one
differing sample anywhere changes it.

Each case runs twice: with the machine's own CPU kernels and with them limited to a lower instruction set
(`mmrl.distributed.determinism.isa_env`). Before model weights were re-homed at aligned addresses, the SD3 case failed on an
AVX-512 machine natively (MKL rounds a weight at an 8-byte offset differently) and with the kernels limited to
AVX2 (`ONEDNN_MAX_CPU_ISA` alone was enough to show it)."""

import hashlib
import json
import os
import sys

import numpy as np
import pytest
from PIL import Image

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HASH_REWARD = f"{os.path.abspath(__file__)}:output_hash"


def output_hash(samples) -> list:
    """Reward: a number fixed by the sample's id and output (text, the image's pixels, or a clip's frames' pixels)."""
    out = []
    for s in samples:
        if hasattr(s.output, "frames"):                                # a rewards.Video
            data = b"".join(f.tobytes() for f in s.output.frames)
        else:
            data = s.output.tobytes() if hasattr(s.output, "tobytes") else str(s.output).encode()
        out.append(int(hashlib.sha256(s.id.encode() + data).hexdigest()[:8], 16) / 0xFFFFFFFF)
    return out


def _command(config: str, out: str, processes: int, rewards: str, kernels: str, free_port) -> tuple[list, dict]:
    """The command and environment of a 1-step run in `processes` processes."""
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                 str(free_port())] if processes == 2 else [sys.executable])
    cmd = [*launcher, "-m", "mmrl", "train", os.path.join(ROOT, "configs", "tiny", config), f"output_dir={out}",
           "max_steps=1", "eval.every=0", "checkpoint.every=0", "logging.save_samples_every=1",
           "train.prompts_per_step=4", "algo.filter.name=none", f"rewards={rewards}"]  # groups filter per process
    from mmrl.distributed.determinism import isa_env, lower_isa

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    return cmd, (env if kernels == "native" else isa_env(lower_isa(), env))


def _samples(out: str) -> dict:
    with open(os.path.join(out, "samples", "step_000001.jsonl")) as f:
        return {r["id"]: r for r in map(json.loads, f)}


def _reward_mean(out: str) -> float:
    with open(os.path.join(out, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if '"loss"' in line][-1]["reward/mean"]


def _same_output(a, b, dir_a: str, dir_b: str) -> bool:
    if isinstance(a, str) and a.endswith(".png"):
        pixels = [np.asarray(Image.open(os.path.join(d, "samples", p))) for d, p in ((dir_a, a), (dir_b, b))]
        return np.array_equal(*pixels)
    if isinstance(a, str) and a.endswith(".gif"):                       # a clip: the same GIF bytes
        with open(os.path.join(dir_a, "samples", a), "rb") as fa, open(os.path.join(dir_b, "samples", b), "rb") as fb:
            return fa.read() == fb.read()
    return a == b


# kernels: the machine's own, or limited to a lower instruction set (mmrl.distributed.determinism.lower_isa), so that an
# exactness that holds on one instruction set only fails on any machine
CONFIGS = {"vlm": ("vlm_tiny.yaml", f"[{{name: format, weight: 0.5}}, {{name: numeric}}, {{name: '{HASH_REWARD}', label: hash}}]"),
           "sd3": ("sd3_tiny.yaml", f"[{{name: jpeg_compressibility}}, {{name: '{HASH_REWARD}', label: hash}}]"),
           "agent": ("agent_tiny.yaml", f"[{{name: env_return}}, {{name: '{HASH_REWARD}', label: hash}}]"),
           "wan": ("wan_tiny.yaml", f"[{{name: per_frame, reward: jpeg_compressibility}}, {{name: '{HASH_REWARD}', label: hash}}]")}
# the agent with both kernels; the VLM and the diffusion families with the lower instruction set only: with the native
# kernels, 1 and 2 processes are compared by test_fsdp.py (vlm_*, sd3_full, wan_lora: rank 0's samples) and
# test_diffusion_cli.py (sd3 under DDP)
CASES = [("agent", "native"), ("agent", "lower"), ("vlm", "lower"), ("sd3", "lower"), ("wan", "lower")]


@pytest.mark.parametrize("config,rewards,kernels", [(*CONFIGS[n], k) for n, k in CASES], ids=[f"{n}-{k}" for n, k in CASES])
def test_one_and_two_processes_sample_the_same_first_step(tmp_path, config, rewards, kernels, free_port,
                                                        run_side_by_side):
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    run_side_by_side([_command(config, one, 1, rewards, kernels, free_port), _command(config, two, 2, rewards, kernels, free_port)],
                     cwd=ROOT)
    all_rows, rank0 = _samples(one), _samples(two)
    assert len(rank0) * 2 == len(all_rows) > 0
    for sid, row in rank0.items():
        ref = all_rows[sid]                                        # same prompt, same sample index
        assert _same_output(ref["output"], row["output"], one, two), sid
        assert ref["scores"] == row["scores"], sid
    assert _reward_mean(one) == pytest.approx(_reward_mean(two), abs=1e-6)           # rank 1's samples too
