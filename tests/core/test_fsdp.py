"""FSDP2 (`distributed.strategy: fsdp`, mmrl/distributed/sharding.py) on CPU over gloo: a 2-process sharded run of the tiny
VLM and SD3 configs, LoRA and full fine-tuning, and of the tiny Wan (video) with LoRA, samples what a 1-process unsharded run samples, and its losses,
gradient norms and trained weights after 3 steps (the Wan: its first step, STEPS) agree within 1e-5; full fine-tuning keeps at most 0.6x the
parameter and optimizer bytes per process. A SIGKILLed sharded run resumes like an unbroken one, and its
2-process checkpoint resumes in 1 process and exports (`mmrl export`)."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from mmrl.distributed.determinism import isa_env, lower_isa
from tests import REPO

pytestmark = [pytest.mark.slow, pytest.mark.integration]
ENV = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
HASH = f"{os.path.join(REPO, 'tests', 'core', 'test_rank_independence.py')}:output_hash"
CASES = {  # config, overrides: every step has rewards that differ within groups (the hash), so gradients are not 0
    "vlm_lora": ("vlm_tiny.yaml", [f"rewards=[{{name: format}}, {{name: '{HASH}', label: hash}}]"]),
    "vlm_full": ("vlm_tiny.yaml", [f"rewards=[{{name: format}}, {{name: '{HASH}', label: hash}}]",
                                   "policy.lora.rank=0", "optim.lr=1e-4"]),
    "vlm_lora_per_block_rollout": ("vlm_tiny.yaml", [f"rewards=[{{name: format}}, {{name: '{HASH}', label: hash}}]",
                                                     "distributed.rollout=sharded"]),   # lockstep generate
    "sd3_lora": ("sd3_tiny.yaml", []),
    "sd3_full": ("sd3_tiny.yaml", ["policy.lora.rank=0", "optim.lr=1e-4"]),   # kl_beta 0.04: a sharded frozen copy
    "wan_lora": ("wan_tiny.yaml", []),                                          # video: the clips' GIFs compared
}
# Steps compared (3 unless named). The sharded run's weights after an update agree with the single process's within
# 1e-5, not bit for bit (the reduction sums in another order), so its next samples can differ in a pixel's last
# step; the tiny Wan's reward, a JPEG size, is not smooth in the pixels and jumps with it (on an Intel Xeon with
# AVX-512: the step-3 reward by 2.8e-5, the grad norm by 1.2e-5, the weights after it by 6e-4, where other CPUs
# agreed). Its first update, from the same weights and the same clips, is what FSDP must match.
STEPS = {"wan_lora": 1}


@pytest.fixture
def launcher(free_port):
    """`launcher(processes)`: the command that starts `-m mmrl ...` in that many processes (torchrun for 2)."""
    def command(processes: int) -> list[str]:
        if processes == 1:
            return [sys.executable]
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes),
                "--master_port", str(free_port())]

    return command


def _train(launcher, config: str, out, processes: int, *overrides: str, fsdp: bool = True, env: dict = ENV,
           steps: int = 3):
    """The command and environment of a `steps`-step run of a tiny config in `processes` processes."""
    cmd = [*launcher(processes), "-m", "mmrl", "train", os.path.join(REPO, "configs", "tiny", config),
           f"output_dir={out}", f"max_steps={steps}", "eval.every=0", "checkpoint.every=0", "logging.save_samples_every=1",
           "logging.progress=false", *(["distributed.strategy=fsdp"] if fsdp else []), *overrides]
    return cmd, env


def _samples(out, step: int = 1) -> dict:
    with open(os.path.join(out, "samples", f"step_{step:06d}.jsonl")) as f:
        return {r["id"]: r for r in map(json.loads, f)}


def _exported(out) -> dict:
    weights = {}
    for name in sorted(os.listdir(out)):
        if name.endswith(".safetensors"):
            weights.update(load_file(os.path.join(out, name)))
    assert weights
    return weights


# every case with the machine's own kernels except sd3_lora and vlm_lora (sd3_full and vlm_full cover the native
# SD3 and VLM paths, vlm_lora_per_block_rollout the native VLM LoRA), and those two with the CPU kernels limited to a
# lower instruction set (mmrl.distributed.determinism): an exactness that holds on one ISA only fails on any machine
LOWER = ("sd3_lora", "vlm_lora")
KERNEL_CASES = [(c, "native") for c in CASES if c not in LOWER] + [(c, "lower") for c in LOWER]


@pytest.fixture(scope="module")
def references() -> dict:
    """{(config, overrides, kernels): (run directory, its export)}: the 1-process unsharded references already
    run and exported in this module. The reference leaves out the distributed.* overrides, so vlm_lora and
    its per-block rollout have the same one: the later case reuses it."""
    return {}


@pytest.mark.parametrize("case,kernels", KERNEL_CASES, ids=[f"{c}-{k}" for c, k in KERNEL_CASES])
def test_two_sharded_processes_train_like_one(tmp_path, case, kernels, launcher, mmrl_cmd, read_metrics,
                                              run_side_by_side, references):
    config, overrides = CASES[case]
    env = ENV if kernels == "native" else isa_env(lower_isa(), ENV)
    reference = (config, tuple(o for o in overrides if not o.startswith("distributed.")), kernels)
    ran = references.get(reference)
    one, two = ran[0] if ran else tmp_path / "one", tmp_path / "two"
    steps = STEPS.get(case, 3)
    run_side_by_side(([] if ran else [_train(launcher, config, one, 1, *reference[1], fsdp=False, env=env,
                                             steps=steps)])
                     + [_train(launcher, config, two, 2, *overrides, env=env, steps=steps)])
    # step 1: rank 0 sampled its prompts (the first half) exactly as the single process did, scored the same
    for sid, row in _samples(two).items():
        ref = _samples(one)[sid]
        if isinstance(row["output"], str) and row["output"].endswith((".png", ".gif")):
            assert (one / "samples" / ref["output"]).read_bytes() == (two / "samples" / row["output"]).read_bytes()
        else:
            assert ref["output"] == row["output"], sid
        assert ref["scores"] == row["scores"], sid
    a, b = read_metrics(one), read_metrics(two)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, steps + 1))
    assert any(r["grad_norm"] > 1e-4 for r in a)                       # the comparison is not of zeros
    for ra, rb in zip(a, b):
        assert rb["reward/mean"] == pytest.approx(ra["reward/mean"], abs=1e-6)
        for key in ("loss", "grad_norm"):
            assert rb[key] == pytest.approx(ra[key], abs=1e-5), (ra["step"], key)
    # the trained weights: the 2-process checkpoint loads in one process (mmrl export) and matches
    run_side_by_side([(mmrl_cmd("export", str(run), str(tmp_path / f"export_{run.name}")), ENV)
                      for run in ((two,) if ran else (one, two))], timeout=300)
    exported_one = ran[1] if ran else tmp_path / "export_one"
    references[reference] = one, exported_one
    wa, wb = _exported(exported_one), _exported(tmp_path / "export_two")
    assert wa.keys() == wb.keys()
    assert max(float((wa[k] - wb[k]).abs().max()) for k in wa) <= 1e-5
    if case.endswith("full"):                                          # sharding halves what each process keeps
        held = [r["mem/params_bytes"] + r["mem/optim_bytes"] for r in (a[-1], b[-1])]
        assert held[1] <= 0.6 * held[0], held
    if case == "vlm_full":
        from transformers import AutoModelForImageTextToText

        model = AutoModelForImageTextToText.from_pretrained(tmp_path / "export_two")
        assert sum(p.numel() for p in model.parameters()) > 0


BANDIT = [os.path.join(REPO, "configs", "tiny", "bandit.yaml"), "max_steps=16", "checkpoint.every=4", "eval.every=6",
          "policy.sleep_s=0.05", "algo.kl_beta=0.05", "train.ema_decay=0.9", "train.ema_every=2",
          "logging.progress=false", "distributed.strategy=fsdp"]


def _bandit(launcher, processes: int, *args: str) -> list[str]:
    return [*launcher(processes), "-m", "mmrl", "train", *BANDIT, *args]


def _comparable(rows) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "mem/peak"))} for r in rows]


def _latest_step(run_dir) -> int:
    try:
        return int((run_dir / "checkpoints" / "latest").read_text().strip().split("_")[1])
    except (FileNotFoundError, ValueError, IndexError):
        return 0


def test_a_killed_sharded_run_resumes_like_an_unbroken_one_and_loads_in_one_process(tmp_path, launcher, read_metrics,
                                                                                    run_side_by_side):
    full, broken = tmp_path / "full", tmp_path / "broken"
    unbroken = subprocess.Popen(_bandit(launcher, 2, f"output_dir={full}"), cwd=REPO, env=ENV,   # beside the broken
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # run: 2 cores
    proc = subprocess.Popen(_bandit(launcher, 2, f"output_dir={broken}"), cwd=REPO, env=ENV, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while _latest_step(broken) < 8 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.02)
    time.sleep(0.1)                                                    # somewhere after the step-8 checkpoint
    assert proc.poll() is None, "the run finished before it could be killed; raise policy.sleep_s"
    os.killpg(proc.pid, signal.SIGKILL)                                # the launcher and both workers
    proc.wait()
    assert 8 <= _latest_step(broken) < 16
    _, err = unbroken.communicate(timeout=300)                        # reads stderr: a full pipe never stalls it
    assert unbroken.returncode == 0, err[-3000:]

    # the resume on the same world size, beside the same 2-process checkpoint resumed in one process (sharded
    # over one, and unsharded)
    ckpt = full / "checkpoints" / "step_000016"
    run_side_by_side([(_bandit(launcher, 2, f"output_dir={broken}", "resume=auto"), ENV)]
                     + [([sys.executable, "-m", "mmrl", "train", *BANDIT, f"output_dir={tmp_path / f'one_{strategy}'}",
                          f"resume={ckpt}", "max_steps=17", f"distributed.strategy={strategy}"], ENV)
                        for strategy in ("fsdp", "ddp")], timeout=300)
    assert _comparable(read_metrics(broken)) == _comparable(read_metrics(full))   # bit-exact on the same world size

    # the 2-process checkpoint in one process: the next step agrees
    for strategy in ("fsdp", "ddp"):
        out = tmp_path / f"one_{strategy}"
        (row,) = read_metrics(out)
        assert row["step"] == 17 and 0 < row["eval/reward/mean"] <= 1
        assert row["mem/params_bytes"] == 2 * read_metrics(full)[-1]["mem/params_bytes"]   # the whole table here
