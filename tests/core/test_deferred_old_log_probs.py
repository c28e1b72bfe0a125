"""Adapters may leave the old log-probs to the update (`Rollout.log_probs is None`): the core then
takes them from the first training forward of a single on-policy pass, or computes them without
grad before a multi-epoch / multi-optimizer-step update. Either way training is the same as with
rollout-time log-probs, to the bit."""

import dataclasses

import pytest
import torch

from mmrl.testing.bandit import BanditPolicy
from mmrl.types import Rollout, concat, select

KEYS = ("reward/mean", "loss", "grad_norm", "clip_frac", "approx_kl", "ratio/max_abs_dev", "ratio/first_max_abs_dev")


@pytest.mark.parametrize("overrides", [
    ("train.update_epochs=1",),                                                   # single pass: no extra forward
    ("train.update_epochs=2",),                                                   # off-policy second epoch
    ("train.update_epochs=1", "train.samples_per_microbatch=8", "train.grad_accum_steps=1"),  # several optimizer steps
], ids=["single-pass", "two-epochs", "grad-accum"])
def test_deferred_old_log_probs_train_exactly_like_recorded_ones(tmp_path, monkeypatch, overrides, run_bandit,
                                                                 train_rows):
    recorded = train_rows(run_bandit(tmp_path / "recorded", "max_steps=4", *overrides).cfg.output_dir)
    calls = []
    rollout = BanditPolicy.rollout
    log_probs = BanditPolicy.log_probs

    def deferring(self, prompts, group_size):
        return dataclasses.replace(rollout(self, prompts, group_size), log_probs=None)

    def counting(self, ro, index, reference=None):
        calls.append(torch.is_grad_enabled())
        return log_probs(self, ro, index, reference)

    monkeypatch.setattr(BanditPolicy, "rollout", deferring)
    monkeypatch.setattr(BanditPolicy, "log_probs", counting)
    deferred = train_rows(run_bandit(tmp_path / "deferred", "max_steps=4", *overrides).cfg.output_dir)
    assert [r["step"] for r in recorded] == [r["step"] for r in deferred] == [1, 2, 3, 4]
    for a, b in zip(recorded, deferred, strict=True):
        for key in KEYS:
            assert a[key] == b[key], (a["step"], key, a[key], b[key])
    no_grad_passes = calls.count(False)
    assert (no_grad_passes == 0) == (overrides[0] == "train.update_epochs=1" and len(overrides) == 1), calls


def test_select_and_concat_keep_deferred_log_probs_deferred():
    ro = Rollout(samples=[0, 1, 2], log_probs=None, mask=torch.ones(3, 2), group=torch.tensor([0, 0, 1]))
    assert len(ro) == 3 and select(ro, torch.tensor([2, 0])).log_probs is None
    both = concat([ro, ro])
    assert len(both) == 6 and both.log_probs is None
    with pytest.raises(ValueError, match="with and without rollout-time log-probs"):
        concat([ro, dataclasses.replace(ro, log_probs=torch.zeros(3, 2))])
