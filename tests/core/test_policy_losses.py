"""The policy-loss registry (algo.policy_loss): CISPO's hand-computed table and gradients, its on-policy parity
with PPO-clip, load-time checks that list the registry's names, and a user's loss from `file.py:fn` training
the bandit. Ratios are built as logp = log(ratio), old = 0."""

import math
import subprocess

import pytest
import torch

from mmrl.config import ConfigError, load_config
from mmrl.algorithms.losses import LossSpec, aggregate, policy_loss
from mmrl.algorithms.policy_losses import POLICY_LOSSES, SurrogateInput, resolve, surrogate
from mmrl.types import Scores

SPEC = LossSpec(policy_loss="cispo", clip_low=0.2, clip_high=0.28)


def T(rows):
    return torch.tensor(rows, dtype=torch.float32)


def _cispo(ratios, adv, mask=None, spec=SPEC):
    logp = torch.log(T(ratios)).requires_grad_(True)
    a = T(adv)[:, None].expand(logp.shape)
    m = torch.ones_like(logp) if mask is None else T(mask)
    l, metrics = surrogate("cispo", SurrogateInput(logp, torch.zeros_like(logp), a, m), spec)
    return logp, l, metrics


def test_cispo_table_weights_each_token_by_its_clipped_detached_ratio():
    # w = clip(r, 0.8, 1.28), l = -w A log r
    # row 0, A = +2: r 1.1 -> w 1.1, l = -2.2 log 1.1 = -0.209682; r 1.5 -> w 1.28 (clipped high), l = -2.56 log 1.5
    #   = -1.037991; r 0.5 -> w 0.8 (clipped low), l = -1.6 log 0.5 = 1.109035; r 1.25 -> w 1.25, l = -0.557859
    # row 1, A = -1: r 0.7 -> w 0.8, l = 0.8 log 0.7 = -0.285340; r 1.0 -> 0;
    #   r 1.4 -> w 1.28, l = 1.28 log 1.4 = 0.430684
    logp, l, m = _cispo([[1.1, 1.5, 0.5, 1.25], [0.7, 1.0, 1.4, 1.0]], [2, -1], mask=[[1, 1, 1, 1], [1, 1, 1, 0]])
    torch.testing.assert_close(l[0], T([-0.209682, -1.037991, 1.109035, -0.557859]), rtol=0, atol=1e-5)
    torch.testing.assert_close(l[1, :3], T([-0.285340, 0.0, 0.430684]), rtol=0, atol=1e-5)
    # the gradient of each token is -w A: no token is dropped, clipped or not (PPO-clip gives 0 at r 1.5, A > 0)
    l.sum().backward()
    torch.testing.assert_close(logp.grad, T([[-2.2, -2.56, -1.6, -2.5], [0.8, 1.0, 1.28, 1.0]]), rtol=0, atol=1e-6)
    # weights at a bound: row 0 r 1.5 and 0.5, row 1 r 0.7 and 1.4 -> 4 of 7 valid tokens
    assert float(m["clip_frac"].value) == pytest.approx(4 / 7)
    assert float(m["clip_frac/high"].value) == pytest.approx(2 / 7)
    assert float(m["clip_frac/low"].value) == pytest.approx(2 / 7)


def test_cispo_on_policy_has_the_ppo_clip_gradient():
    torch.manual_seed(0)
    logp0, adv, mask = torch.randn(3, 5), torch.randn(3, 5), torch.ones(3, 5)
    grads = {}
    for name in ("cispo", "ppo_clip"):
        logp = logp0.clone().requires_grad_(True)
        l, _ = surrogate(name, SurrogateInput(logp, logp0.clone(), adv, mask), LossSpec(policy_loss=name))
        aggregate(l, mask, "token-mean").backward()
        grads[name] = logp.grad
    torch.testing.assert_close(grads["cispo"], grads["ppo_clip"], rtol=0, atol=0)


def test_gspo_dual_clip_and_grpo_guard_tables():
    """Each clipped entry by hand on one sample, ratios r = (2, 1) on two actions, eps = 0.2 / 0.28."""
    old, mask = torch.zeros(1, 2), torch.ones(1, 2)
    logp = torch.log(T([[2.0, 1.0]]))
    spec = LossSpec(clip_low=0.2, clip_high=0.28)
    # gspo: s = exp(mean log r) = sqrt 2 = 1.41421 for both actions; A = 1 > 0 clips at 1.28: l = -1.28 each
    l, m = surrogate("gspo", SurrogateInput(logp, old, T([[1.0, 1.0]]), mask), spec)
    torch.testing.assert_close(l, T([[-1.28, -1.28]]), rtol=0, atol=1e-6)
    assert float(m["clip_frac"].value) == 1.0
    # ppo_clip per token for comparison: r 2 clips at 1.28, r 1 does not -> (-1.28, -1)
    l, _ = surrogate("ppo_clip", SurrogateInput(logp, old, T([[1.0, 1.0]]), mask), spec)
    torch.testing.assert_close(l, T([[-1.28, -1.0]]), rtol=0, atol=1e-6)
    # dual_clip, A = -1: ppo gives max(-r A, -clip(r) A) = (2, 1); the cap -c A = 3 (c unset: 3) or 1.5 (c = 1.5)
    adv = T([[-1.0, -1.0]])
    l, m = surrogate("dual_clip", SurrogateInput(logp, old, adv, mask), spec)
    torch.testing.assert_close(l, T([[2.0, 1.0]]), rtol=0, atol=1e-6)
    l, m = surrogate("dual_clip", SurrogateInput(logp, old, adv, mask), LossSpec(clip_low=0.2, clip_high=0.28,
                                                                                 dual_clip=1.5))
    torch.testing.assert_close(l, T([[1.5, 1.0]]), rtol=0, atol=1e-6)
    assert float(m["clip_frac/dual"].value) == 0.5
    # grpo_guard: log r_hat = s (log r + b) with s = 0.5, b = (0, log 2): r_hat = (sqrt 2, sqrt 2) -> -1.28 each
    std, drift = torch.full((1, 2), 0.5), T([[0.0, math.log(2.0)]])
    l, m = surrogate("grpo_guard", SurrogateInput(logp, old, T([[1.0, 1.0]]), mask, (std, drift)), spec)
    torch.testing.assert_close(l, T([[-1.28, -1.28]]), rtol=0, atol=1e-6)
    assert float(m["ratio/raw_mean"].value) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="grpo_guard.*step_std"):
        surrogate("grpo_guard", SurrogateInput(logp, old, T([[1.0, 1.0]]), mask), spec)


def test_flags_that_became_losses_name_the_loss_and_saved_configs_migrate(tmp_path, bandit_config):
    from mmrl.config import migrate

    for key, value, loss in (("algo.ratio_level", "sequence", "gspo"), ("algo.ratio_norm", "true", "grpo_guard"),
                             ("algo.ratio_level", "token", "gspo")):
        with pytest.raises(ConfigError, match=rf"'{key}' is gone.*algo.policy_loss={loss}"):
            load_config(bandit_config, [f"output_dir={tmp_path}", f"{key}={value}"])
    saved = {"algo": {"policy_loss": "ppo_clip", "ratio_level": "sequence", "ratio_norm": False, "dual_clip": None}}
    assert migrate(saved)["algo"] == {"policy_loss": "gspo", "dual_clip": None}
    saved = {"algo": {"policy_loss": "ppo_clip", "ratio_level": "token", "ratio_norm": True}}
    assert migrate(saved)["algo"] == {"policy_loss": "grpo_guard"}
    saved = {"algo": {"policy_loss": "ppo_clip", "ratio_level": "token", "ratio_norm": False, "dual_clip": 3.0}}
    assert migrate(saved)["algo"] == {"policy_loss": "dual_clip", "dual_clip": 3.0}
    with pytest.raises(ConfigError, match="policy_loss=cispo.*'gspo'.*start a new run"):
        migrate({"algo": {"policy_loss": "cispo", "ratio_level": "sequence"}})
    # GRPO-Guard's loss needs Gaussian denoising steps: the bandit has none
    with pytest.raises(ConfigError, match=r"'algo.policy_loss' \(grpo_guard\): GRPO-Guard needs"):
        load_config(bandit_config, [f"output_dir={tmp_path}", "algo.policy_loss=grpo_guard"])


def test_policy_loss_uses_the_configured_entry():
    logp = torch.log(T([[1.5, 0.5]]))
    scores = Scores(log_probs=logp)
    spec = LossSpec(policy_loss="cispo", clip_low=0.2, clip_high=0.28)
    loss, metrics = policy_loss(scores, torch.zeros(1, 2), T([2.0]), torch.ones(1, 2), None, spec)
    assert float(loss) == pytest.approx((-2.56 * math.log(1.5) + 1.6 * math.log(2.0)) / 2, abs=1e-6)
    assert "clip_frac" in metrics and "pg_loss" in metrics


def test_the_registry_lists_its_entries_and_refuses_what_a_loss_cannot_honour(tmp_path, bandit_config):
    assert POLICY_LOSSES.names() == ["cispo", "dual_clip", "grpo_guard", "gspo", "ppo_clip"]
    with pytest.raises(ConfigError, match=r"algo.policy_loss.*unknown policy loss 'ppo'; valid names: cispo, "
                                          r"dual_clip, grpo_guard, gspo, ppo_clip"):
        load_config(bandit_config, [f"output_dir={tmp_path}", "algo.policy_loss=ppo"])
    for loss in ("cispo", "ppo_clip", "gspo"):
        with pytest.raises(ConfigError, match=rf"algo.dual_clip.*constant of algo.policy_loss=dual_clip; with "
                                              rf"algo.policy_loss={loss} set algo.dual_clip=null"):
            load_config(bandit_config, [f"output_dir={tmp_path}", f"algo.policy_loss={loss}", "algo.dual_clip=3"])
    with pytest.raises(ConfigError, match=r"algo.policy_loss.*does not exist"):
        load_config(bandit_config, [f"output_dir={tmp_path}", f"algo.policy_loss={tmp_path}/none.py:fn"])
    (tmp_path / "notfn.py").write_text("LOSS = 3\n")
    with pytest.raises(ValueError, match="is a int, not a function"):
        resolve(f"{tmp_path}/notfn.py:LOSS")


@pytest.mark.integration
def test_the_cli_names_the_registry_on_a_bad_policy_loss(tmp_path, mmrl_cmd, bandit_config):
    done = subprocess.run(mmrl_cmd("train", bandit_config, f"output_dir={tmp_path}", "algo.policy_loss=nope"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "unknown policy loss 'nope'; valid names: cispo, dual_clip, grpo_guard, gspo, ppo_clip" in done.stderr
    assert "Traceback" not in done.stderr
    shown = subprocess.run(mmrl_cmd("train", "--help"), capture_output=True, text=True, timeout=120).stdout
    assert ("algo.policy_loss: cispo, dual_clip, grpo_guard, gspo, ppo_clip (or 'module:attr' / "
            "'path/to/file.py:attr')") in shown
    assert "algo.objective: decoupled, nft, pg" in shown


USER_LOSS = '''
import torch


def reinforce(inp, spec):
    """Plain REINFORCE: l = -A log pi (no ratio, no clip), with a metric of its own."""
    l = -inp.adv * inp.logp
    return l, {"my/adv_abs": (inp.adv.abs() * inp.mask).sum() / inp.mask.sum()}
'''


def test_a_users_loss_from_a_file_trains_the_bandit(tmp_path, read_metrics, run_bandit, train_rows):
    path = tmp_path / "my_loss.py"
    path.write_text(USER_LOSS)
    run_bandit(tmp_path / "run", f"algo.policy_loss={path}:reinforce", "max_steps=30", "train.update_epochs=1")
    train = train_rows(tmp_path / "run")
    assert all("my/adv_abs" in r and "clip_frac" not in r for r in train)
    assert sum(r["reward/mean"] for r in train[:3]) / 3 < 0.35                 # chance is 1/8 per position
    assert sum(r["reward/mean"] for r in train[-3:]) / 3 > 0.8
    evals = [r["eval/reward/mean"] for r in read_metrics(tmp_path / "run") if "eval/reward/mean" in r]
    assert evals[-1] > evals[0]


def test_cispo_trains_the_bandit(tmp_path, run_bandit, train_rows):
    run_bandit(tmp_path, "algo.policy_loss=cispo", "algo.clip_low=0.99", "algo.clip_high=0.28")
    train = train_rows(tmp_path)
    assert sum(r["reward/mean"] for r in train[-3:]) / 3 > 0.85
    assert all(r["ratio/first_max_abs_dev"] == 0.0 for r in train)          # on-policy ratio exactly 1


@pytest.mark.parametrize("loss", ["dual_clip", "gspo"])
def test_dual_clip_and_gspo_train_the_bandit_on_policy(tmp_path, loss, run_bandit, train_rows):
    """The bandit's arms are tokens, so a sequence ratio is a mean of per-token ones: both entries learn and the
    first forward of each step sees a ratio of exactly 1."""
    run_bandit(tmp_path, f"algo.policy_loss={loss}", "max_steps=40")
    train = train_rows(tmp_path)
    assert sum(r["reward/mean"] for r in train[-3:]) / 3 > 0.8
    assert all(r["ratio/first_max_abs_dev"] == 0.0 for r in train)
