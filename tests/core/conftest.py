"""Fixtures of the core tests: a bandit policy with its optimizer and scheduler, saved as a checkpoint directly
(`checkpoint.save`, no run)."""

import pytest


def _bandit_objects(value: float):
    import torch

    from mmrl.testing.bandit import BanditPolicy, Config as BanditConfig

    policy = BanditPolicy(BanditConfig(), torch.device("cpu"))
    with torch.no_grad():
        policy.net.theta.fill_(value)
    optimizer = torch.optim.AdamW(policy.trainable_parameters(), lr=0.1)
    return policy, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 1.0)


@pytest.fixture
def bandit_objects():
    """`bandit_objects(value)`: a bandit policy whose logits are all `value`, with its optimizer and scheduler
    (what `checkpoint.save` writes and `checkpoint.load` fills)."""
    return _bandit_objects


@pytest.fixture
def save_bandit():
    """`save_bandit(root, step, value=None)`: `checkpoint.save` of a bandit whose logits are all `value` (the step
    when None) as step `step` under `root`, its state tagged "theta <value>", keeping 5; returns its path."""
    from mmrl.state import checkpoint

    def save(root, step: int, value: float | None = None) -> str:
        value = step if value is None else value
        return checkpoint.save(str(root), step, *_bandit_objects(value), {"tag": f"theta {value}"}, keep_last=5)

    return save
