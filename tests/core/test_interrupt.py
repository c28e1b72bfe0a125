"""Interruptible rollouts (asynchronous.interrupt): a rollout worker, built in process, is offered newer weights
while it samples a plan; the reply (VLM, an agent's) or the trajectory (text-to-image) stops at the next action
boundary and goes on under the new weights, and an agent's next turn starts with them. Per action: the version
that produced it, and a behaviour log-prob equal to that version's own (the forward training uses, under each part's
weights)."""

from __future__ import annotations

import os

import pytest
import torch

from tests import REPO

pytest.importorskip("ray")


def _worker(config: str, *overrides: str, weights: tuple = ("object_store", ())):
    from mmrl.config import load_config, to_yaml
    from mmrl.loop.asynchronous.worker import RolloutWorker

    cfg = load_config(os.path.join(REPO, "configs", "tiny", f"{config}.yaml"), ["output_dir=/tmp/unused", *overrides])
    return RolloutWorker(to_yaml(cfg), 0, cwd=REPO, behaviour=True, threads=1, interrupt=True, weights=weights), cfg


def _sampled(worker, plan: list, weights: list):
    """The rollout of plan 0 over the records `plan`, handed out with `weights` as version 0 (one share)."""
    (share,), _ = worker.generate(0, plan, 0, [weights])
    return share[0]


def _two_versions(worker) -> tuple[list, list]:
    """The worker's weights (version 0) and a perturbation of them (version 1), as the learner would send them."""
    torch.manual_seed(0)
    v0 = [p.detach().clone() for p in worker.params]
    v1 = [w + 0.5 * torch.randn_like(w) for w in v0]
    return v0, v1


def _offer_at(worker, k: int, version: int, weights: list) -> list[int]:
    """Make the controller's offer of `version` arrive just before the policy's k-th action boundary (1-based);
    returns the versions each boundary reported."""
    seen = []

    def check() -> int:
        if len(seen) + 1 == k:
            worker.offer(version, [weights])
        seen.append(worker.check())
        return seen[-1]

    worker.policy.interrupt_with(check)
    return seen


def _per_version_log_probs(worker, rollout, weights: dict) -> torch.Tensor:
    """[N, T] each action's log-prob under the weights of its version, computed here pass by pass."""
    out = torch.zeros(rollout.mask.shape)
    for v, w in weights.items():
        worker._load(v, w)
        out = torch.where(rollout.versions == v, worker._log_probs(rollout, worker.policy), out)
    return out


@pytest.mark.parametrize("share", ["true", "false"])
def test_an_interrupted_vlm_reply_has_each_parts_behaviour_log_probs(share):
    worker, cfg = _worker("vlm_tiny", f"policy.share_prefix_generation={share}")
    v0, v1 = _two_versions(worker)
    plan = list(range(cfg.train.prompts_per_step))
    whole = _sampled(worker, plan, v0)                      # no offer: every token by version 0
    assert torch.equal(whole.versions, torch.zeros_like(whole.versions))

    seen = _offer_at(worker, 5, 1, v1)          # boundaries: the first call's start, then after each token
    ro = _sampled(worker, plan, v0)
    mask = ro.mask.bool()
    assert seen[:4] == [0, 0, 0, 0] and set(seen[4:]) == {1} and worker.version == 1
    g = cfg.train.group_size
    first = ro.versions[:g]                                           # the first prompt's rows: interrupted
    assert (first[:, :4] == 0).all() and (first[:, 4:][mask[:g, 4:]] == 1).all() and mask[:g, 4:].any()
    assert (ro.versions[g:][mask[g:]] == 1).all()                     # later calls: all under version 1
    assert (ro.versions[:, 1:] >= ro.versions[:, :-1]).all()          # versions never go back along a reply
    # the first 4 tokens are the uninterrupted run's; what follows is version 1's
    ids = [s.meta["completion_ids"] for s in ro.samples]
    ids0 = [s.meta["completion_ids"] for s in whole.samples]
    assert [x[:4] for x in ids[:g]] == [x[:4] for x in ids0[:g]] and ids != ids0
    assert [ids[j][4:] for j in range(g) if len(ids[j]) > 4] == _continued(worker, cfg, plan, v1, ids[:g], 4)
    expected = _per_version_log_probs(worker, ro, {0: v0, 1: v1})
    assert torch.equal(ro.log_probs[mask], expected[mask])            # each part's own weights, to the bit
    assert not torch.equal(ro.log_probs[mask], _per_version_log_probs(worker, ro, {0: v0, 1: v0})[mask])


def test_an_interrupted_reply_over_gloo_equals_the_one_given_the_tensors():
    """The worker's weights over its own gloo group (asynchronous.weight_sync=gloo): the plan's version when it
    starts, the offered one at the 5th boundary; the handles are only versions. The reply, its versions and its
    behaviour log-probs are the ones of the worker handed the tensors themselves, bit for bit."""
    from mmrl.distributed.weight_sync import WEIGHT_SYNC

    direct, cfg = _worker("vlm_tiny")
    v0, v1 = _two_versions(direct)
    plan = list(range(cfg.train.prompts_per_step))
    _offer_at(direct, 5, 1, v1)
    expected = _sampled(direct, plan, v0)
    publisher = WEIGHT_SYNC.resolve("gloo").publisher(30.0)
    try:
        worker, _ = _worker("vlm_tiny", weights=("gloo", publisher.receiver_args()))
        for version, tensors in ((0, v0), (1, v1)):
            assert publisher.handle(version, lambda t=tensors: t) == version
        _offer_at(worker, 5, 1, 1)                      # offer(1, [1]): the handle, not the tensors
        (share,), _ = worker.generate(0, plan, 0, [0])
        ro = share[0]
        assert worker.receiver.pair == 1 and worker.version == 1
        assert [s.meta["completion_ids"] for s in ro.samples] == [s.meta["completion_ids"] for s in expected.samples]
        assert torch.equal(ro.versions, expected.versions) and set(ro.versions[ro.mask.bool()].tolist()) == {0, 1}
        assert torch.equal(ro.log_probs, expected.log_probs)
    finally:
        publisher.close()


def _continued(worker, cfg, plan: list, weights: list, first: list, k: int) -> list:
    """What `weights` sample after the first k tokens of the first prompt's rows that had not stopped: from the
    prompt followed by those tokens, each row's generator past its k draws, within the budget left."""
    from mmrl.data import prompt_seed
    from mmrl.types import PromptBatch
    from vlm.generation import extend_prompt, sample_seed

    policy, backend = worker.policy, worker.policy.p.backend
    seeds = [prompt_seed(cfg.seed, 0, j) for j in range(len(plan))]
    (item,) = policy._prompts(PromptBatch(rows=[worker.generator.records[plan[0]]], index=plan[:1], step=0,
                                          seeds=seeds[:1]))
    live = [j for j, x in enumerate(first) if len(x) > k and x[k - 1] not in backend.stop_ids]
    gens = [torch.Generator().manual_seed(sample_seed(seeds[0], j)) for j in live]
    for g in gens:
        for _ in range(k):
            torch.rand((), generator=g, dtype=torch.float64)
    worker._load(1, weights)
    backend.check = None
    spec = policy._sampling()
    rows = [extend_prompt(item, torch.tensor(first[j][:k])) for j in live]
    from dataclasses import replace

    with torch.no_grad():
        out = backend._generate(rows, replace(spec, max_new_tokens=spec.max_new_tokens - k), gens, policy.device,
                                share=False)
    return [tokens.tolist() for tokens, _ in out]


def test_an_interrupted_diffusion_trajectory_has_each_steps_behaviour_log_probs():
    worker, cfg = _worker("sd3_tiny")
    v0, v1 = _two_versions(worker)
    plan = list(range(cfg.train.prompts_per_step))
    whole = _sampled(worker, plan, v0)

    seen = _offer_at(worker, 2, 1, v1)                                # before denoising step 1 (of 0..3)
    ro = _sampled(worker, plan, v0)
    whole_ro = whole
    assert seen == [0, 1, 1, 1]
    steps = ro.state["step_index"]                                    # [N, T] trained steps 0, 1, 2
    assert torch.equal(ro.versions, (steps >= 1).long())
    # step 0 ran under version 0 exactly as without the offer; every later step under version 1
    assert torch.equal(ro.log_probs[:, 0], whole_ro.log_probs[:, 0])
    assert torch.equal(ro.state["latents"][:, :2], whole_ro.state["latents"][:, :2])
    assert not torch.equal(ro.state["latents"][:, 2:], whole_ro.state["latents"][:, 2:])
    expected = _per_version_log_probs(worker, ro, {0: v0, 1: v1})   # the training forward, step by step
    assert torch.equal(ro.log_probs, expected)


def _action_ids(ro, i: int) -> torch.Tensor:
    """[T_i] the token ids of trajectory i's replies, in column order (from its scoring views)."""
    views = sorted(ro.state["views"][i], key=lambda v: v.column)
    return torch.cat([v.inputs.input_ids[v.positions] for v in views])


def _agent_columns(ro) -> list[list[slice]]:
    """Per trajectory, the action columns of each of its replies (replies fill the columns in turn order)."""
    from mmrl.episodes import EpisodeMeta

    out = []
    for s in ro.samples:
        ends = torch.tensor(s.meta[EpisodeMeta.TURN_TOKENS]).cumsum(0).tolist()
        out.append([slice(a, b) for a, b in zip([0] + ends[:-1], ends)])
    return out


@pytest.mark.parametrize("where", ["inside a reply", "between turns"])
def test_an_interrupted_agent_episode_has_each_replys_behaviour_log_probs(where):
    """The tiny agent (FrozenLake, 3 turns): the offer lands after the 4th token of the first group's first replies,
    or once the first group's first reply was stepped (its next turn starts with the new weights). Replies before
    it are the uninterrupted run's; each token's behaviour log-prob is its own version's, to the bit."""
    worker, cfg = _worker("agent_tiny")
    v0, v1 = _two_versions(worker)
    plan = list(range(cfg.train.prompts_per_step))
    whole = _sampled(worker, plan, v0)
    assert torch.equal(whole.versions, torch.zeros_like(whole.versions))

    runner, g = worker.policy.episodes, cfg.train.group_size
    if where == "inside a reply":
        seen = _offer_at(worker, 5, 1, v1)
    else:
        seen = _offer_at(worker, 0, 1, v1)                            # no offer from the check itself
        record = runner.record

        def record_then_offer(t, tokens, ended, turn):
            record(t, tokens, ended, turn)
            if turn == 0 and worker.version == 0:
                worker.offer(1, [v1])

        runner.record = record_then_offer
    ro = _sampled(worker, plan, v0)
    mask = ro.mask.bool()
    assert worker.version == 1 and seen[0] == 0 and seen[-1] == 1
    cols, whole_cols = _agent_columns(ro), _agent_columns(whole)
    for i in range(len(ro)):
        for turn, c in enumerate(cols[i]):
            v = ro.versions[i, c]
            if i >= g or turn > 0:
                assert (v == 1).all(), (i, turn)                      # after the offer: the new weights only
            elif where == "between turns":
                assert (v == 0).all()                                 # the replies stepped before the offer
            else:
                assert (v[:4] == 0).all() and (v[4:] == 1).all()
    assert (ro.versions[:, 1:] >= ro.versions[:, :-1]).all()          # never back along a trajectory
    # the first group's tokens before the offer are the uninterrupted run's: its first replies (between turns) or
    # their first 4 tokens (inside a reply); what follows differs
    for i in range(g):
        before = cols[i][0] if where == "between turns" else slice(0, 4)
        assert cols[i][0] == whole_cols[i][0] or where == "inside a reply"
        assert torch.equal(_action_ids(ro, i)[before], _action_ids(whole, i)[before])
    assert [_action_ids(ro, i).tolist() for i in range(len(ro))] != \
        [_action_ids(whole, i).tolist() for i in range(len(ro))]
    assert ro.log_probs is not None
    expected = _per_version_log_probs(worker, ro, {0: v0, 1: v1})
    assert torch.equal(ro.log_probs[mask], expected[mask])
    assert not torch.equal(ro.log_probs[mask], _per_version_log_probs(worker, ro, {0: v0, 1: v0})[mask])
