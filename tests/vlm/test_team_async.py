"""Multi-role episodes in the asynchronous trainer's rollout workers (configs/tiny/team_tiny.yaml: a tiny Qwen2.5-VL
speaker with LoRA and a tiny LLaVA listener): a worker holds the whole team, loads every policy's weights as one
version, plays each plan's joint round and returns each policy's rollout, scored, with its behaviour log-probs by
the policy that sampled it; with eta = 0 and one worker the run trains what the synchronous trainer trains."""

from __future__ import annotations

import os

import pytest
import torch

from tests import REPO

pytest.importorskip("ray")
TEAM = os.path.join(REPO, "configs", "tiny", "team_tiny.yaml")
REWARD = os.path.join(REPO, "tests", "vlm", "team_reward.py") + ":distinct_letters"


def _load(*overrides: str):
    from mmrl.config import load_config

    return load_config(TEAM, [f"rewards=[{{name: '{REWARD}'}}]", "policy.max_new_tokens=12", *overrides])


def test_a_worker_plays_the_teams_rounds_with_each_policys_weights_and_behaviour_log_probs():
    from mmrl.config import to_yaml
    from mmrl.loop.asynchronous.worker import RolloutWorker

    cfg = _load("output_dir=/tmp/unused", "asynchronous.enabled=true", "asynchronous.max_staleness=1")
    worker = RolloutWorker(to_yaml(cfg), 0, cwd=REPO, behaviour=True, threads=1)
    assert list(worker.policies) == ["policy", "listener"]
    sizes = [len(list(p.trainable_parameters())) for p in worker.policies.values()]
    assert len(worker.params) == sum(sizes) and min(sizes) > 0
    torch.manual_seed(0)
    version = [w.detach() + 0.01 * torch.randn_like(w) for w in worker.params]     # as the learner sends them
    shares, info = worker.generate(0, [3, 5], 2, [version], world=2)
    assert worker.version == 2 and info["load_s"] >= 0
    listener = worker.policies["listener"]
    assert all(torch.equal(p, w) for p, w in zip(listener.trainable_parameters(), version[sizes[0]:]))
    for r, share in enumerate(shares):                         # one prompt per learner process, G = 4
        assert list(share) == ["policy", "listener"]
        for name, (ro, scores, _) in share.items():
            assert len(ro) == 4 and scores.shape == (4, 1), name
            assert ro.versions[ro.mask.bool()].unique().tolist() == [2], name
            assert {s.meta["env_seed"] for s in ro.samples} == {[3, 5][r]}, name
            assert {s.meta["role"] for s in ro.samples} == {"speaker" if name == "policy" else name}, name
            own = worker._log_probs(ro, worker.policies[name])                         # [N, T]
            assert ro.log_probs is not None and torch.equal(ro.log_probs, own), name
    speaker, listens = shares[0]["policy"][0], shares[0]["listener"][0]
    for s, heard in zip(speaker.samples, listens.samples):    # each listener heard its own episode's message
        assert f"Your partner's message: {' '.join(s.output.split())[:200] or '(nothing)'}" in heard.prompt
    with pytest.raises(RuntimeError, match="version 3 has 1 trainable tensors"):
        worker.generate(1, [3, 5], 3, [version[:1]])


def _weights(run_dir) -> dict:
    from safetensors.torch import load_file

    last = os.path.join(run_dir, "checkpoints", "step_000003")
    files = ["policy.safetensors", os.path.join("policies", "listener", "policy.safetensors")]
    return {f"{n}:{k}": v for n in files for k, v in load_file(os.path.join(last, n)).items()}


@pytest.mark.integration
@pytest.mark.slow
def test_eta_0_with_one_worker_trains_the_team_as_the_synchronous_trainer(ray_cluster, tmp_path, comparable_rows,
                                                                          run_samples, read_metrics):
    """Both policies' losses, rewards, samples (every role's, with their versions) and final weights: the same bits
    as the synchronous trainer's."""
    from mmrl.loop.trainer import train

    common = ("max_steps=3", "logging.save_samples_every=1", "eval.every=0", "checkpoint.every=3",
              "logging.progress=false")
    sync = train(_load(f"output_dir={tmp_path / 'sync'}", *common))
    run = train(_load(f"output_dir={tmp_path / 'async'}", *common, "asynchronous.enabled=true",
                      "asynchronous.cpus_per_worker=2"))
    assert [r["async/version"] for r in read_metrics(run) if "policy/loss" in r] == [0, 1, 2]   # sampled by a worker
    rows = comparable_rows(run)
    assert rows == comparable_rows(sync) and len(rows) == 3
    for name in ("policy", "listener"):
        assert all(r[f"{name}/grad_norm"] > 0 for r in rows), name
    samples = run_samples(run)
    assert samples == run_samples(sync) and len(samples) == 3
    assert {v for rows in samples.values() for r in rows for v in r["versions"]} == {0, 1, 2}
    ours, theirs = _weights(run), _weights(sync)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
