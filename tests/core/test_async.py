"""Asynchronous training on Ray (mmrl/loop/asynchronous): the config section and staleness rules (unit), and runs on a
local Ray cluster of 2 CPUs started once for the module (integration): eta = 0 with one rollout worker trains
exactly what the synchronous trainer trains (VLM and diffusion), eta = k bounds every trained action's age, `drop`
discards, a resumed run continues the unbroken one, and the CLI runs it."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from tests import BANDIT, REPO

T2I = os.path.join(REPO, "configs", "tiny", "t2i_shapes.yaml")      # the text-to-image default: DiffusionNFT
VLM_TINY = os.path.join(REPO, "configs", "tiny", "vlm_tiny.yaml")


# --- unit: the section's checks and the rules ---------------------------------------------------------------
def _load(*overrides: str, path: str = BANDIT):
    from mmrl.config import load_config

    return load_config(path, list(overrides))


@pytest.mark.parametrize("override, message", [
    ("asynchronous.max_staleness=-1", "'asynchronous.max_staleness' must be >= 0"),
    ("asynchronous.rollout_workers=0", "'asynchronous.rollout_workers' must be >= 1"),
    ("asynchronous.cpus_per_worker=-1", "'asynchronous.cpus_per_worker' must be >= 0"),
    ("asynchronous.timeout_s=0", "'asynchronous.timeout_s' must be > 0"),
    ("asynchronous.on_stale=skip", "drop, pace"),
    ("asynchronous.address=somewhere", "'asynchronous.address' must be null"),
    ("asynchronous.worker_resources={rollout: 0}", "'asynchronous.worker_resources.rollout' must be a number > 0"),
    ("asynchronous.max_restarts=-1", "'asynchronous.max_restarts' must be >= 0"),
    ("asynchronous.reward_workers=-1", "'asynchronous.reward_workers' must be >= 0"),
    ("asynchronous.cpus_per_reward_worker=-1", "'asynchronous.cpus_per_reward_worker' must be >= 0"),
    ("algo.filter.name=dynamic", "'algo.filter.name' is dynamic"),
    ("asynchronous.learner_processes=-1", "'asynchronous.learner_processes' must be >= 0"),
    ("asynchronous.cpus_per_learner=-1", "'asynchronous.cpus_per_learner' must be >= 0"),
    ("asynchronous.learner_placement=diagonal", "pack, spread, strict_pack, strict_spread"),
    ("asynchronous.learner_processes=3", "'asynchronous.learner_processes' is 3: train.prompts_per_step=4 must be "
                                         "divisible"),
])
def test_the_section_is_checked_at_load(override, message):
    from mmrl.config import ConfigError

    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        _load("asynchronous.enabled=true", override)


def test_diffusion_nft_runs_asynchronously_but_is_not_interrupted():
    from mmrl.config import ConfigError

    _load("asynchronous.enabled=true", "asynchronous.max_staleness=1", path=T2I)
    with pytest.raises(ConfigError, match="'algo.objective' is nft with asynchronous.interrupt=true"):
        _load("asynchronous.enabled=true", "asynchronous.interrupt=true", path=T2I)


def test_vllm_rollout_workers_are_not_interrupted():
    """vLLM samples in rollout workers (tests/vlm/test_vlm_vllm.py runs it, in the vLLM venv), but its generate call
    does not stop at a token boundary: with asynchronous.interrupt it is a config error."""
    from mmrl.config import ConfigError

    assert _load("asynchronous.enabled=true", "policy.backend=vllm", path=VLM_TINY).policy.backend == "vllm"
    with pytest.raises(ConfigError, match="'policy.backend' is vllm with asynchronous.interrupt=true"):
        _load("asynchronous.enabled=true", "policy.backend=vllm", "asynchronous.interrupt=true", path=VLM_TINY)


def test_learner_processes_on_ray_and_torchrun_together_are_a_config_error(monkeypatch):
    from mmrl.config import ConfigError
    from mmrl.loop.asynchronous.learners import train_on_ray

    monkeypatch.setenv("WORLD_SIZE", "2")                        # a process of a torchrun launch
    with pytest.raises(ConfigError, match="'asynchronous.learner_processes' is 2: the learner runs as Ray actors, "
                                          "but this command was launched with torchrun"):
        train_on_ray(_load("asynchronous.enabled=true", "asynchronous.learner_processes=2"), None)


def test_the_section_is_not_checked_when_off():
    cfg = _load("asynchronous.max_staleness=-1")       # enabled=false: the synchronous trainer ignores it
    assert cfg.asynchronous.enabled is False


def test_a_missing_ray_is_a_config_error_naming_the_extra(monkeypatch):
    from mmrl.config import ConfigError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"Ray is not installed: pip install -e \"\.\[ray\]\""):
        _load("asynchronous.enabled=true")


# (plan, learner version, eta, queued) -> may the plan start; (batch version, step, eta) -> is it trained
@pytest.mark.parametrize("rule, start_cases, keep_cases", [
    ("pace", [((3, 3, 0, 0), True), ((4, 3, 0, 1), False), ((5, 3, 2, 2), True), ((6, 3, 2, 3), False)],
     [((3, 3, 0), True), ((1, 3, 2), True), ((0, 3, 2), False)]),
    ("drop", [((4, 3, 0, 1), True), ((9, 0, 0, 9), True)],
     [((3, 3, 0), True), ((2, 3, 0), False), ((1, 3, 2), True), ((0, 3, 2), False)]),
])
def test_staleness_rules(rule, start_cases, keep_cases):
    from mmrl.config.asynchronous import STALENESS

    entry = STALENESS.resolve(rule, "asynchronous.on_stale")
    for args, expected in start_cases:
        assert entry.start(*args) is expected, (rule, args)
    for args, expected in keep_cases:
        assert entry.keep(*args) is expected, (rule, args)


# --- integration: runs on a local Ray cluster -----------------------------------------------------------------
def _train(config: str, out_dir, *overrides: str) -> str:
    from mmrl.loop.trainer import train

    return train(_load(f"output_dir={out_dir}", "logging.progress=false", *overrides, path=config))


def _weights(run_dir) -> dict:
    from safetensors.torch import load_file

    ckpts = os.path.join(run_dir, "checkpoints")
    last = os.path.join(ckpts, sorted(d for d in os.listdir(ckpts) if d.startswith("step_"))[-1])
    names = sorted(n for n in os.listdir(last) if n.startswith("policy") and n.endswith(".safetensors"))
    return {f"{n}:{k}": v for n in names for k, v in load_file(os.path.join(last, n)).items()}   # + NFT's old copy


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("config", ["vlm_tiny", "sd3_tiny", "t2i_shapes"])
def test_eta_0_with_one_worker_trains_what_the_synchronous_trainer_trains(ray_cluster, tmp_path, config,
                                                                         comparable_rows, run_samples):
    """Samples (outputs, image pixels, scores, advantages), rewards, loss and grad_norm of 3 steps, and the final
    weights: the same bits as the synchronous trainer's. t2i_shapes trains DiffusionNFT: the workers sample with the
    learner's old copy (after step 1 it is no longer the trained weights: old <- eta old + (1 - eta) theta)."""
    path = os.path.join(REPO, "configs", "tiny", f"{config}.yaml")
    common = ("max_steps=3", "logging.save_samples_every=1", "eval.every=0", "checkpoint.every=0",
              *(["train.prompts_per_step=2"] if config == "t2i_shapes" else []))   # 16 clips a step, not 64
    sync = _train(path, tmp_path / "sync", *common)
    run = _train(path, tmp_path / "async", *common, "asynchronous.enabled=true", "asynchronous.cpus_per_worker=2")
    assert comparable_rows(run) == comparable_rows(sync)
    assert [r["grad_norm"] for r in comparable_rows(run)] != [0.0] * 3                    # something was trained
    samples = run_samples(run)
    assert samples == run_samples(sync) and len(samples) == 3
    assert {v for rows in samples.values() for r in rows for v in r["versions"]} == {0, 1, 2}
    ours, theirs = _weights(run), _weights(sync)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def _versions(run_dir, per_sample: bool = False) -> list[tuple[int, list[int]]]:
    """(training step, every trained action's version) per samples file, or per sample."""
    folder = os.path.join(run_dir, "samples")
    out = []
    for name in sorted(f for f in os.listdir(folder) if f.startswith("step_") and f.endswith(".jsonl")):
        step = int(name[len("step_"):-len(".jsonl")]) - 1                      # file step_k: trained at step k-1
        samples = [json.loads(line)["versions"] for line in open(os.path.join(folder, name))]
        out += [(step, v) for v in samples] if per_sample else [(step, [v for vs in samples for v in vs])]
    return out


@pytest.mark.integration
def test_eta_2_with_two_workers_trains_no_action_older_than_2_and_pace_drops_none(ray_cluster, tmp_path, train_rows):
    run = _train(BANDIT, tmp_path / "run", "max_steps=12", "logging.save_samples_every=1", "eval.every=0",
                 "asynchronous.enabled=true", "asynchronous.rollout_workers=2", "asynchronous.max_staleness=2")
    ages = [step - v for step, versions in _versions(run) for v in versions]
    assert len(_versions(run)) == 12 and min(ages) >= 0
    assert max(ages) <= 2
    assert max(ages) >= 1            # the workers sampled ahead of the learner (else the bound tested nothing)
    rows = train_rows(run)
    assert sum(r["async/dropped_groups"] for r in rows) == 0
    assert max(r["async/staleness/max"] for r in rows) == max(ages)
    assert rows[-1]["reward/mean"] > rows[0]["reward/mean"]                      # it still learns


@pytest.mark.integration
def test_interrupted_replies_take_newer_weights_within_the_bound(ray_cluster, tmp_path, train_rows):
    """The tiny VLM, eta = 1, two workers, asynchronous.interrupt: each new version is offered to the sampling
    workers, which take it after their current token (or before the next prompt's first). Along each reply the
    versions never go back, no trained token is more than 1 version old, nothing is discarded, and
    `async/interrupted_frac` counts the replies that span versions. Whether a version lands while a plan is
    sampled depends on timing (on a quiet machine it did in 3 runs of 3; on CI's busy cores not always), so it is
    not asserted here: `tests/core/test_interrupt.py` offers a version at a chosen token, in process, and checks
    the interrupted reply's tokens and behaviour log-probs."""
    path = VLM_TINY
    run = _train(path, tmp_path / "run", "max_steps=6", "logging.save_samples_every=1", "eval.every=0",
                 "checkpoint.every=0", "algo.objective=decoupled", "asynchronous.enabled=true",
                 "asynchronous.rollout_workers=2", "asynchronous.max_staleness=1", "asynchronous.interrupt=true")
    per_sample = _versions(run, per_sample=True)
    assert len({step for step, _ in per_sample}) == 6
    assert all(versions == sorted(versions) for _, versions in per_sample)
    ages = [step - v for step, versions in per_sample for v in versions]
    assert min(ages) >= 0 and max(ages) <= 1
    rows = train_rows(run)
    started = {r["step"] - 1: r["async/version"] for r in rows}
    assert all(min(versions) >= started[step] for step, versions in per_sample)   # never older than the plan
    spans = [len(set(versions)) > 1 for _, versions in per_sample]
    assert sum(r["async/interrupted_frac"] for r in rows) == pytest.approx(sum(spans) / (len(spans) / 6))
    assert sum(r["async/dropped_groups"] for r in rows) == 0


@pytest.mark.integration
def test_drop_discards_batches_older_than_the_bound(ray_cluster, tmp_path, train_rows):
    """eta = 0 with two workers: the second worker's batches, sampled while the learner updated, are one version
    old when their turn comes, so some are discarded, and every trained action is from the trained weights."""
    run = _train(BANDIT, tmp_path / "run", "max_steps=6", "logging.save_samples_every=1", "eval.every=0",
                 "asynchronous.enabled=true", "asynchronous.rollout_workers=2", "asynchronous.on_stale=drop")
    assert all(v == step for step, versions in _versions(run) for v in versions)
    rows = train_rows(run)
    assert len(rows) == 6 and sum(r["async/dropped_groups"] for r in rows) > 0


@pytest.mark.integration
def test_a_resumed_asynchronous_run_continues_the_unbroken_one(ray_cluster, tmp_path, comparable_rows):
    common = ("eval.every=0", "checkpoint.every=2", "asynchronous.enabled=true")
    unbroken = _train(BANDIT, tmp_path / "unbroken", "max_steps=6", *common)
    _train(BANDIT, tmp_path / "parts", "max_steps=4", *common)
    resumed = _train(BANDIT, tmp_path / "parts", "max_steps=6", "resume=auto", *common)
    assert comparable_rows(resumed) == comparable_rows(unbroken)
    with open(os.path.join(resumed, "checkpoints", "step_000006", "state.json")) as f:
        assert json.load(f)["async_plan"] == 6


@pytest.mark.integration
def test_a_resumed_run_that_discarded_plans_trains_to_its_last_step(ray_cluster, tmp_path, train_rows):
    """With drop, plan numbers run ahead of steps by the plans discarded; a resume continues both counts."""
    common = ("eval.every=0", "checkpoint.every=2", "asynchronous.enabled=true", "asynchronous.rollout_workers=2",
              "asynchronous.on_stale=drop")
    _train(BANDIT, tmp_path / "run", "max_steps=4", *common)
    with open(os.path.join(tmp_path / "run", "checkpoints", "step_000004", "state.json")) as f:
        first = json.load(f)
    assert first["async_plan"] == 4 + first["async_dropped_plans"] and first["async_dropped_plans"] > 0
    run = _train(BANDIT, tmp_path / "run", "max_steps=6", "resume=auto", *common)
    assert [r["step"] for r in train_rows(run)] == [1, 2, 3, 4, 5, 6]
    with open(os.path.join(run, "checkpoints", "step_000006", "state.json")) as f:
        last = json.load(f)
    assert last["async_plan"] == 6 + last["async_dropped_plans"] >= first["async_plan"] + 2


@pytest.mark.integration
@pytest.mark.parametrize("reward_workers, weight_sync", [(0, "object_store"), (1, "object_store"), (0, "gloo")],
                         ids=["rollout_worker", "reward_worker", "rollout_worker_gloo"])
def test_a_killed_worker_is_restarted_and_its_plan_sampled_again(ray_cluster, tmp_path, train_rows, reward_workers,
                                                                 weight_sync, monkeypatch, comparable_rows,
                                                                 run_samples):
    """The worker that scores SIGKILLs itself while scoring plan 2 (tests/core/dying_reward.py): the rollout worker,
    or with asynchronous.reward_workers=1 the reward worker. Ray restarts it and sends the plan again, so the run
    trains every plan exactly once: the same rows and samples as the synchronous run (a reward worker pool with
    eta = 0 trains what the synchronous trainer trains). With asynchronous.weight_sync=gloo the weights of every
    version come over the worker's own process group, and the rebuilt worker joins a new one."""
    from mmrl.distributed.weight_sync import PairPublisher

    publishers, build = [], PairPublisher.__init__
    monkeypatch.setattr(PairPublisher, "__init__", lambda self, *a, **k: publishers.append(self) or build(self, *a, **k))
    marker = tmp_path / "died"
    reward = (f"rewards=[{{name: '{os.path.join(REPO, 'tests', 'core', 'dying_reward.py')}:match_or_die', "
              f"label: match, marker: '{marker}', driver_pid: {os.getpid()}, die_on_call: 3}}]")
    common = ("max_steps=5", "eval.every=0", "logging.save_samples_every=1", reward)
    sync = _train(BANDIT, tmp_path / "sync", *common)
    run = _train(BANDIT, tmp_path / "async", *common, "asynchronous.enabled=true",
                 f"asynchronous.reward_workers={reward_workers}", f"asynchronous.weight_sync={weight_sync}")
    assert marker.exists()                                      # the worker did die
    assert comparable_rows(run) == comparable_rows(sync)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "versions"} for r in rows]   # noqa: E731
    assert [strip(rows) for rows in run_samples(run).values()] == [strip(rows) for rows in run_samples(sync).values()]
    assert train_rows(run)[-1]["async/worker_restarts"] == 1
    # over gloo: the learner served the worker's pair and the rebuilt worker's new one
    assert [p.pairs for p in publishers] == ([2] if weight_sync == "gloo" else [])


def _latest_step(run_dir) -> int:
    try:
        with open(os.path.join(run_dir, "checkpoints", "latest")) as f:
            return int(f.read().strip().split("_")[1])
    except (FileNotFoundError, ValueError, IndexError):
        return 0


@pytest.mark.integration
@pytest.mark.slow
def test_a_killed_driver_resumes_with_resume_auto(tmp_path, mmrl_cmd, comparable_rows):
    """SIGKILL of `mmrl train` (the learner and controller) after its step-4 checkpoint; `resume=auto` samples
    the plans not yet trained again and ends where an unbroken run ends (eta = 0: the synchronous run's rows)."""
    common = ("max_steps=12", "checkpoint.every=4", "eval.every=0", "policy.sleep_s=0.05")
    run = tmp_path / "run"
    command = mmrl_cmd("train", BANDIT, f"output_dir={run}", *common, "asynchronous.enabled=true")
    with open(tmp_path / "first.log", "w") as log:
        proc = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=log)
        deadline = time.time() + 180
        while _latest_step(run) < 4 and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert proc.poll() is None, "the run ended before it could be killed: " + (tmp_path / "first.log").read_text()[-2000:]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert 4 <= _latest_step(run) < 12
    done = subprocess.run(command + ["resume=auto"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    sync = _train(BANDIT, tmp_path / "sync", *common)
    assert comparable_rows(run) == comparable_rows(sync)


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "ray_actors"])
def test_a_learner_of_two_processes_trains_what_the_synchronous_two_process_run_trains(tmp_path, free_port, mmrl_cmd,
                                                                                      run_side_by_side, strategy,
                                                                                      comparable_rows, run_samples):
    """A learner of 2 processes, eta = 0, one rollout worker: the worker samples each plan in 2 shares, process 0
    scatters them, each process filters and trains its own; rows (reduced over processes), process 0's samples and
    the final weights equal the synchronous 2-process (torchrun, DDP) run's, bit for bit. fsdp: torchrun's 2
    processes under FSDP2, whose published weights are the shards gathered on both processes after each update, sent
    to the worker over its own gloo group (asynchronous.weight_sync=gloo), beside the learner's process group.
    ray_actors: no torchrun, `mmrl train` starts the 2 learner processes (DDP, weights through the object store) as
    Ray actors in a placement group (asynchronous.learner_processes=2). (DDP under torchrun was a third case; the two
    cover its parts: the shares and DDP, and torchrun's launch.)"""
    path = VLM_TINY
    common = ("max_steps=3", "logging.save_samples_every=1", "eval.every=0", "checkpoint.every=0",
              "logging.progress=false", f"distributed.strategy={'fsdp' if strategy == 'fsdp' else 'ddp'}")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}

    def launched(out, *extra):
        return ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                 str(free_port()), "-m", "mmrl", "train", path, f"output_dir={out}", *common, *extra], env)

    sync, run = tmp_path / "sync", tmp_path / "async"
    if strategy == "ray_actors":             # the rollout worker's CPU and the two learners' halves: the 2 cores
        on_ray = (mmrl_cmd("train", path, f"output_dir={run}", *common, "asynchronous.enabled=true",
                           "asynchronous.learner_processes=2", "asynchronous.cpus_per_learner=0.5"), env)
    else:
        sync_kind = "gloo" if strategy == "fsdp" else "object_store"
        on_ray = launched(run, "asynchronous.enabled=true", f"asynchronous.weight_sync={sync_kind}")
    run_side_by_side([launched(sync), on_ray], timeout=900)
    assert comparable_rows(run) == comparable_rows(sync) and len(comparable_rows(run)) == 3
    assert run_samples(run) == run_samples(sync)
    if strategy == "fsdp":                  # a sharded checkpoint: the weights as `mmrl export` writes them
        from safetensors.torch import load_file

        run_side_by_side([(mmrl_cmd("export", str(r), str(tmp_path / f"export_{r.name}")), env) for r in (sync, run)])
        ours, theirs = ({k: v for f in sorted((tmp_path / f"export_{r.name}").glob("*.safetensors"))
                         for k, v in load_file(f).items()} for r in (run, sync))
    else:
        ours, theirs = _weights(run), _weights(sync)
    assert ours and ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.integration
def test_more_workers_than_the_cluster_holds_is_a_config_error(ray_cluster, tmp_path):
    from mmrl.config import ConfigError

    with pytest.raises(ConfigError, match=r"'asynchronous.rollout_workers' \(3\) x 'asynchronous.cpus_per_worker' "
                                          r"\(1.0\) need 3 CPUs; the Ray cluster has 2"):
        _train(BANDIT, tmp_path / "run", "asynchronous.enabled=true", "asynchronous.rollout_workers=3")
    with pytest.raises(ConfigError, match=r"\+ 'asynchronous.reward_workers' \(2\) x "
                                          r"'asynchronous.cpus_per_reward_worker' \(1.0\) need 3 CPUs"):
        _train(BANDIT, tmp_path / "run", "asynchronous.enabled=true", "asynchronous.reward_workers=2")
    with pytest.raises(ConfigError, match=r"\+ 'asynchronous.learner_processes' \(2\) x "
                                          r"'asynchronous.cpus_per_learner' \(1.0\) need 3 CPUs"):
        _train(BANDIT, tmp_path / "run", "asynchronous.enabled=true", "asynchronous.learner_processes=2")
    with pytest.raises(ConfigError, match=r"'asynchronous.learner_processes' \(1\) x "
                                          r"'asynchronous.learner_resources.learner' \(1.0\) need 1 learners; the Ray "
                                          r"cluster has 0"):
        _train(BANDIT, tmp_path / "run", "asynchronous.enabled=true", "asynchronous.learner_processes=1",
               "asynchronous.learner_resources={learner: 1}")


@pytest.mark.integration
def test_cli_trains_asynchronously(tmp_path, mmrl_cmd, train_rows):
    out = tmp_path / "run"
    done = subprocess.run(mmrl_cmd("train", BANDIT, f"output_dir={out}", "max_steps=3", "eval.every=0",
                                   "asynchronous.enabled=true", "asynchronous.max_staleness=1"),
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = train_rows(out)
    assert len(rows) == 3 and all("async/staleness/max" in r for r in rows)
    assert max(r["async/staleness/max"] for r in rows) <= 1
