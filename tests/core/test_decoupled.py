"""AReaL's decoupled PPO objective (algo.objective=decoupled, mmrl/algorithms/objectives/decoupled.py): a hand-computed
table, parity with AReaL's own loss function, equality with pg on on-policy samples, the proximal policy recomputed
every step, the missing-behaviour error, and the checks at load."""

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from mmrl.algorithms import objectives
from mmrl.algorithms.losses import LossSpec
from mmrl.algorithms.objectives.decoupled import DecoupledConfig, decoupled_loss
from mmrl.config import AlgoConfig, ConfigError
from mmrl.distributed.reduce import Metric
from mmrl.testing.bandit import BanditPolicy
from mmrl.types import Rollout, Scores


def _value(m):
    return m.value if isinstance(m, Metric) else m


# ---------------------------------------------------------------- a hand-computed table
# eps_low 0.2, eps_high 0.28 (clip range [0.8, 1.28]), token_mask with cap 2, token-mean; probabilities, not logs:
#  action  pi_theta pi_prox pi_behav   r = theta/prox  w = prox/behav   A     l = -min(rA, clip(r) A)    w l
#  a       0.6      0.5     0.4        1.2             1.25             +1    -min(1.2, 1.2)   = -1.2    -1.5
#  b       0.7      0.5     0.5        1.4             1                +2    -min(2.8, 2.56)  = -2.56   -2.56
#  c       0.3      0.5     0.2        0.6             2.5 > 2: masked  -1    -min(-0.6, -0.8) =  0.8     0
#  d       0.3      0.4     0.5        0.75            0.8              -1    -min(-0.75, -0.8) = 0.8     0.64
#  e       0.9      0.5     0.3        1.8             5/3              -0.5  -min(-0.9, -0.64) = 0.9     1.5
#  (pad)   0.5      0.5     0.9        -               0                 0
# loss = (-1.5 - 2.56 + 0 + 0.64 + 1.5) / 5 valid actions = -1.92 / 5 = -0.384
# behav_weight_mean = (1.25 + 1 + 0 + 0.8 + 5/3) / 5 = 4.716667 / 5 = 0.943333; outside_frac = 1 / 5 = 0.2
THETA = [[0.6, 0.7, 0.3], [0.3, 0.9, 0.5]]
PROX = [[0.5, 0.5, 0.5], [0.4, 0.5, 0.5]]
BEHAV = [[0.4, 0.5, 0.2], [0.5, 0.3, 0.9]]
ADV = [[1.0, 2.0, -1.0], [-1.0, -0.5, 0.0]]
MASK = [[1, 1, 1], [1, 1, 0]]


def _logs(p):
    return torch.log(torch.tensor(p, dtype=torch.float32))


def test_hand_computed_table():
    spec = LossSpec(clip_low=0.2, clip_high=0.28)
    logp = _logs(THETA).requires_grad_()
    loss, m = decoupled_loss(Scores(log_probs=logp), _logs(PROX), _logs(BEHAV), torch.tensor(ADV),
                             torch.tensor(MASK), None, spec, DecoupledConfig(mode="token_mask", max=2.0))
    assert float(loss.detach()) == pytest.approx(-0.384, abs=1e-6)
    assert float(_value(m["decoupled/behav_weight_mean"])) == pytest.approx(0.943333, abs=1e-6)
    assert float(_value(m["decoupled/outside_frac"])) == pytest.approx(0.2, abs=1e-7)
    # |log prox - log behav|: ln 1.25, 0, ln 2.5, ln 1.25, ln(5/3) = 0.223144 + 0.916291 + 0.223144 + 0.510826
    assert float(_value(m["decoupled/prox_behav_abs_diff"])) == pytest.approx(1.873404 / 5, abs=1e-6)
    loss.backward()
    # d loss / d logp = -w r A / 5 where the unclipped term is taken (a: -1.25 * 1.2 / 5 = -0.3, e: 5/3 * 1.8 * 0.5 / 5
    # = 0.3), 0 where the clip is active (b, d), masked (c) or padding
    torch.testing.assert_close(logp.grad, torch.tensor([[-0.3, 0.0, 0.0], [0.0, 0.3, 0.0]]), rtol=0, atol=1e-6)


@pytest.mark.parametrize("pos,want", [((0, 0), -1.5), ((0, 1), -2.56), ((0, 2), 0.0), ((1, 0), 0.64), ((1, 1), 1.5)])
def test_hand_computed_table_per_action(pos, want):
    """The table's last column: a mask holding one action makes token-mean that action's w l (token weights)."""
    mask = torch.zeros(2, 3)
    mask[pos] = 1
    loss, _ = decoupled_loss(Scores(log_probs=_logs(THETA)), _logs(PROX), _logs(BEHAV), torch.tensor(ADV), mask, None,
                             LossSpec(clip_low=0.2, clip_high=0.28), DecoupledConfig(mode="token_mask", max=2.0))
    assert float(loss) == pytest.approx(want, abs=1e-6)


def test_a_weight_at_the_cap_stays_and_one_above_it_leaves():
    """AReaL keeps w <= cap (`behav_imp_weight <= behav_imp_weight_cap`); mmrl's band is closed too. With cap 1
    (w = 1 exactly where prox == behav) the first action stays and the second (w = e^0.5) leaves."""
    prox = torch.tensor([[-1.0, -1.0]])
    behav = torch.tensor([[-1.0, -1.5]])                       # log w = 0, 0.5
    logp = torch.tensor([[-1.0, -1.0]])                        # r = 1
    loss, m = decoupled_loss(Scores(log_probs=logp), prox, behav, torch.tensor([1.0]), torch.ones(1, 2), None,
                             LossSpec(), DecoupledConfig(max=1.0))
    assert float(loss) == -0.5                                 # (-1 * 1 + 0) / 2
    assert float(_value(m["decoupled/outside_frac"])) == 0.5


# ---------------------------------------------------------------- parity with AReaL
def areal_ppo_actor_loss(logprobs, proximal_logprobs, old_logprobs, advantages, eps_clip, loss_mask,
                         eps_clip_higher=None, c_clip=None, behav_imp_weight_cap=None, importance_sampling_level="token"):
    """Transcribed from inclusionAI/AReaL, areal/utils/functional/functional.py `ppo_actor_loss_fn` at commit
    61d1bbb3d5c8891a76f5c461a5e1fde1dbf0270a (the last with `behav_imp_weight_cap`, before its rejection_sampling
    rewrite); the 2D padded branch of `_compute_sequence_level_ratio_and_advantages`; the loss only, no stats."""
    loss_mask_count = loss_mask.count_nonzero() or 1
    if importance_sampling_level == "sequence":
        log_ratio = logprobs - proximal_logprobs
        seq_log_ratio_mean = torch.where(loss_mask, log_ratio, 0.0).sum(dim=1) / loss_mask.sum(dim=1).clamp(min=1)
        ratio = torch.exp(seq_log_ratio_mean.unsqueeze(1).expand_as(log_ratio))
        ratio = torch.where(loss_mask, ratio, 0.0)
        seq_lengths = loss_mask.sum(dim=-1, keepdim=True).clamp(min=1)
        advantages = (advantages.sum(dim=-1, keepdim=True) / seq_lengths).expand_as(log_ratio)
    else:
        ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)
    clipped_ratio = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + (eps_clip if eps_clip_higher is None else eps_clip_higher))
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    pg_loss = torch.max(pg_loss1, pg_loss2)
    if c_clip is not None:
        assert c_clip > 1.0, c_clip
        pg_loss3 = torch.sign(advantages) * c_clip * advantages
        pg_loss = torch.min(pg_loss, pg_loss3)
    behav_kl = proximal_logprobs - old_logprobs
    behav_imp_weight = behav_kl.exp()
    behav_mask = ((behav_imp_weight <= behav_imp_weight_cap).logical_and(loss_mask)
                  if behav_imp_weight_cap is not None else loss_mask)
    behav_imp_weight = torch.where(behav_mask, behav_imp_weight, 0.0)
    pg_loss = pg_loss * behav_imp_weight
    return torch.where(loss_mask, pg_loss, 0).sum() / loss_mask_count


def _random_batch(seed: int, n: int = 6, t: int = 10):
    g = torch.Generator().manual_seed(seed)
    behav = -torch.rand(n, t, generator=g) * 3                                  # [n, T]
    prox = behav + 1.2 * torch.randn(n, t, generator=g)                         # stale samples: w from ~0.1 to ~10
    logp = prox + 0.5 * torch.randn(n, t, generator=g)                          # r across the clips, some > 3
    adv = torch.randn(n, generator=g)                                           # [n] one per sample
    lengths = torch.randint(t // 2, t + 1, (n,), generator=g)
    mask = torch.arange(t)[None, :] < lengths[:, None]                          # [n, T] right padding
    return logp, prox, behav, adv, mask


# (mmrl policy loss, AReaL importance_sampling_level, eps_high or None, dual-clip c or None)
LOSSES = [("ppo_clip", "token", None, None), ("ppo_clip", "token", 0.28, None), ("dual_clip", "token", 0.28, 3.0),
          ("dual_clip", "token", None, 2.0), ("gspo", "sequence", 0.28, None)]


@pytest.mark.parametrize("cap", [None, 5.0, 1.5])
@pytest.mark.parametrize("loss_name,level,eps_high,c", LOSSES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_parity_with_areal_ppo_actor_loss_fn(seed, loss_name, level, eps_high, c, cap):
    """Random stale batches: mmrl's loss (token_mask with max = cap; max=null is AReaL's cap None, the raw weight)
    equals AReaL's to 1e-6, token-mean. AReaL's dual clip min(l, sign(A) c A) = min(l, c |A|) also covers A > 0, but
    there l = -A min(r, clip(r)) <= 0 < c A, so it only acts where A < 0, as mmrl's dual_clip does: they agree."""
    logp, prox, behav, adv, mask = _random_batch(seed)
    spec = LossSpec(policy_loss=loss_name, clip_low=0.2, clip_high=0.2 if eps_high is None else eps_high, dual_clip=c)
    ours, _ = decoupled_loss(Scores(log_probs=logp), prox, behav, adv, mask.float(), None, spec,
                             DecoupledConfig(mode="token_mask", max=cap))
    adv_tokens = torch.where(mask, adv[:, None].expand_as(logp), 0.0)         # AReaL's per-token advantages, 0 at padding
    theirs = areal_ppo_actor_loss(logp, prox, behav, adv_tokens, 0.2, mask, eps_clip_higher=eps_high, c_clip=c,
                                  behav_imp_weight_cap=cap, importance_sampling_level=level)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_parity_batches_reach_the_cap_and_the_clips(seed):
    """The random batches above exercise what they compare: weights above the caps, ratios outside the clip range."""
    logp, prox, behav, adv, mask = _random_batch(seed)
    assert (adv > 0).any() and (adv < 0).any()
    w, r = torch.exp(prox - behav)[mask], torch.exp(logp - prox)[mask]
    assert (w > 5).any() and (w > 1.5).any() and (w < 1).any()
    assert (r > 1.28).any() and (r < 0.8).any()
    negative = (adv[:, None].expand_as(mask) < 0)[mask]
    assert (negative & (r > 2)).any()                         # where the dual clip with c = 2 acts
    assert seed == 1 or (negative & (r > 3)).any()            # and with c = 3 (seeds 0 and 2)


def test_parity_through_the_registered_objective():
    """objectives.resolve("decoupled").build(...) on a tiny policy whose log-probs are a parameter: the first
    microbatch loss equals AReaL's, the proximal log-probs being the recomputed ones (not the rollout's)."""
    logp, prox, behav, adv, mask = _random_batch(3)
    policy = TablePolicy(prox)                          # the current weights score prox
    ro = Rollout(samples=list(range(6)), log_probs=behav, mask=mask.float(), group=torch.arange(6) // 3)
    algo = dataclasses.replace(AlgoConfig(), objective="decoupled", clip_high=0.28, decoupled=DecoupledConfig(max=5.0))
    loss_of = objectives.resolve("decoupled").build(_input(policy, algo, ro, adv))
    with torch.no_grad():
        policy.theta.copy_(logp)                        # an update happened between build and the loss
    loss, m = loss_of(torch.arange(6), 0, None)
    adv_tokens = torch.where(mask, adv[:, None].expand_as(logp), 0.0)
    theirs = areal_ppo_actor_loss(logp, prox, behav, adv_tokens, 0.2, mask, eps_clip_higher=0.28, behav_imp_weight_cap=5.0)
    torch.testing.assert_close(loss, theirs, rtol=0, atol=1e-6)
    assert "clip_frac" in m and "decoupled/behav_weight_mean" in m


# ---------------------------------------------------------------- through the objective
class TablePolicy:
    """The smallest policy: log-probs are a parameter [N, T]; counts the no-grad and grad calls of log_probs."""

    def __init__(self, log_probs: torch.Tensor):
        self.theta = torch.nn.Parameter(log_probs.clone())
        self.calls = []

    def log_probs(self, rollout, index, reference=None) -> Scores:
        self.calls.append(torch.is_grad_enabled())
        return Scores(log_probs=self.theta[index])


def _input(policy, algo, ro, adv, old=None):
    def recompute():
        with torch.no_grad():
            return policy.log_probs(ro, torch.arange(len(ro))).log_probs

    return objectives.ObjectiveInput(policy=policy, algo=algo, batch=SimpleNamespace(rollout=ro),
                                     advantages=adv, old_log_probs=lambda: old, recompute_log_probs=recompute)


def test_on_policy_the_weight_is_one_and_the_loss_is_pg_s():
    """prox == behav bitwise: w is exactly 1 and decoupled's loss and gradient equal pg's to the bit."""
    logp, _, _, adv, mask = _random_batch(4)
    ro = Rollout(samples=list(range(6)), log_probs=logp.clone(), mask=mask.float(), group=torch.arange(6) // 3)
    results = {}
    for name in ("pg", "decoupled"):
        policy = TablePolicy(logp)
        algo = dataclasses.replace(AlgoConfig(), objective=name, clip_high=0.28)
        loss, m = objectives.resolve(name).build(_input(policy, algo, ro, adv, old=ro.log_probs))(torch.arange(6), 0,
                                                                                                    None)
        loss.backward()
        results[name] = (loss.detach(), policy.theta.grad, m)
    assert torch.equal(results["pg"][0], results["decoupled"][0])
    assert torch.equal(results["pg"][1], results["decoupled"][1])
    m = results["decoupled"][2]
    assert float(_value(m["decoupled/behav_weight_mean"])) == 1.0
    assert float(_value(m["decoupled/outside_frac"])) == 0.0
    assert float(_value(m["decoupled/prox_behav_abs_diff"])) == 0.0


def test_the_engine_log_probs_are_the_behaviour_policy_where_the_rollout_has_them():
    """With Rollout.engine_log_probs (vLLM) pi_behav is the engine's, not the trainer's rollout-time log-probs."""
    logp, prox, behav, adv, mask = _random_batch(5)
    ro = Rollout(samples=list(range(6)), log_probs=prox.clone(), mask=mask.float(), group=torch.arange(6) // 3,
                 engine_log_probs=behav)
    algo = dataclasses.replace(AlgoConfig(), objective="decoupled")
    loss, _ = objectives.resolve("decoupled").build(_input(TablePolicy(prox), algo, ro, adv))(torch.arange(6), 0, None)
    want, _ = decoupled_loss(Scores(log_probs=prox), prox, behav, adv, mask.float(), None, LossSpec(), DecoupledConfig())
    torch.testing.assert_close(loss, want, rtol=0, atol=0)


def test_missing_behaviour_log_probs_is_an_error():
    _, prox, _, adv, mask = _random_batch(6)
    ro = Rollout(samples=list(range(6)), log_probs=None, mask=mask.float(), group=torch.arange(6) // 3)
    algo = dataclasses.replace(AlgoConfig(), objective="decoupled")
    with pytest.raises(ValueError, match=r"behaviour policy's log-probs.*neither Rollout.engine_log_probs nor "
                                         r"Rollout.log_probs"):
        objectives.resolve("decoupled").build(_input(TablePolicy(prox), algo, ro, adv))


def test_the_proximal_policy_is_recomputed_in_build_before_any_update():
    """build calls recompute_log_probs once, without grad, even for a single on-policy pass; the microbatch loss
    runs with grad."""
    logp, _, _, adv, mask = _random_batch(7)
    ro = Rollout(samples=list(range(6)), log_probs=logp.clone(), mask=mask.float(), group=torch.arange(6) // 3)
    policy = TablePolicy(logp)
    algo = dataclasses.replace(AlgoConfig(), objective="decoupled")
    loss_of = objectives.resolve("decoupled").build(_input(policy, algo, ro, adv))
    assert policy.calls == [False]
    loss_of(torch.arange(3), 0, None)
    assert policy.calls == [False, True]


def test_a_training_step_recomputes_even_in_a_single_pass_and_equals_pg(tmp_path, monkeypatch, run_bandit, train_rows):
    """The bandit (rollout-time log-probs, its own forward): with update_epochs=1 pg runs no no-grad pass, decoupled
    one per step (32 samples in microbatches of 8: 4 calls); the samples are on-policy, so the runs match to the bit."""
    calls = []
    log_probs = BanditPolicy.log_probs

    def counting(self, ro, index, reference=None):
        calls.append(torch.is_grad_enabled())
        return log_probs(self, ro, index, reference)

    monkeypatch.setattr(BanditPolicy, "log_probs", counting)
    steps = ["max_steps=2", "eval.every=0", "train.update_epochs=1"]
    pg = train_rows(run_bandit(tmp_path / "pg", *steps).cfg.output_dir)
    assert calls.count(False) == 0
    calls.clear()
    dec = train_rows(run_bandit(tmp_path / "dec", *steps, "algo.objective=decoupled").cfg.output_dir)
    assert calls.count(False) == 2 * 4
    for a, b in zip(pg, dec, strict=True):
        for key in ("reward/mean", "loss", "grad_norm", "clip_frac", "ratio/first_max_abs_dev"):
            assert a[key] == b[key], (a["step"], key)
        assert b["decoupled/behav_weight_mean"] == 1.0 and b["decoupled/prox_behav_abs_diff"] == 0.0


# ---------------------------------------------------------------- checks at load
def test_the_default_section_loads(tmp_path, bandit_cfg):
    cfg = bandit_cfg(tmp_path, "algo.objective=decoupled")
    assert cfg.algo.decoupled == DecoupledConfig(mode="token_mask", max=5.0, min=None)
    assert bandit_cfg(tmp_path, "algo.objective=decoupled", "algo.decoupled.max=null").algo.decoupled.max is None


@pytest.mark.parametrize("overrides,match", [
    (["algo.decoupled.mode=none"], r"'algo.decoupled.mode' must be one of sequence_mask, sequence_truncate, "
                                   r"token_mask, token_truncate; got 'none'"),
    (["algo.decoupled.mode=tis"], r"'algo.decoupled.mode' must be one of .*got 'tis'"),
    (["algo.decoupled.max=0"], r"'algo.decoupled.max' must be > 0 or null, got 0"),
    (["algo.decoupled.max=-2"], r"'algo.decoupled.max' must be > 0 or null"),
    (["algo.decoupled.min=0"], r"'algo.decoupled.min' must be > 0 or null"),
    (["algo.decoupled.max=0.5"], r"'algo.decoupled.max' \(0.5\) must be >= 1 or null"),
    (["algo.decoupled.min=1.5"], r"'algo.decoupled.min' \(1.5\) must be <= 1 or null"),
    (["algo.decoupled.mode=token_truncate", "algo.decoupled.max=null"], r"nothing to clip to"),
    (["algo.rollout_correction.mode=token_truncate"],
     r"'algo.rollout_correction.mode' is token_truncate, but algo.objective=decoupled already weights.*covers the "
     r"engine mismatch: set algo.rollout_correction.mode=none"),
])
def test_the_section_is_checked_at_load(tmp_path, bandit_cfg, overrides, match):
    with pytest.raises(ConfigError, match=match):
        bandit_cfg(tmp_path, "algo.objective=decoupled", *overrides)


def test_the_section_is_checked_only_for_its_objective(tmp_path, bandit_cfg):
    """Like algo.nft, algo.decoupled is read (and checked) only with algo.objective=decoupled."""
    assert bandit_cfg(tmp_path, "algo.decoupled.max=0").algo.objective == "pg"
