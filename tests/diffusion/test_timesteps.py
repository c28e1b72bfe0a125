"""Timestep policies pick the right SDE and trained steps; bad settings are errors naming the key."""

import pytest
import torch

from diffusion.timesteps import TimestepsConfig, plan, trained_index, validate, window_start


def _plan(select, s=10, n=3, step=0, seed=0, **kw):
    return plan(TimestepsConfig(select=select, **kw), s, n, step, torch.Generator().manual_seed(seed))


def test_all_trains_every_step():
    p = _plan("all")
    assert bool(p.sde.all()) and bool(p.trained.all())


def test_first_k_trains_the_leading_steps_with_sde_everywhere():
    p = _plan("first_k", k=9)                                   # Flow-GRPO: 9 of 10
    assert bool(p.sde.all())
    index, mask = trained_index(p.trained)
    assert index.tolist() == [list(range(9))] * 3 and bool((mask == 1).all())


def test_fraction_draws_a_random_subset_per_sample():
    p = _plan("fraction", n=4, fraction=0.6)                     # DanceGRPO: 60%
    assert bool(p.sde.all()) and p.trained.sum(1).tolist() == [6, 6, 6, 4 + 2]
    assert len({tuple(r.tolist()) for r in p.trained}) > 1     # not the same steps for every sample
    again = _plan("fraction", n=4, fraction=0.6)
    assert torch.equal(p.trained, again.trained)                # seeded
    index, _ = trained_index(p.trained)
    assert all(row == sorted(row) for row in index.tolist())


@pytest.mark.parametrize("step,start", [(0, 0), (1, 0), (2, 2), (5, 4), (7, 6), (100, 6)])
def test_window_advances_with_the_training_step_and_stops_at_the_end(step, start):
    cfg = TimestepsConfig(select="window", window_size=4, window_stride=2, window_every=2)   # MixGRPO
    assert window_start(cfg, 10, step) == start
    p = plan(cfg, 10, 2, step, torch.Generator())
    inside = torch.zeros(10, dtype=torch.bool)
    inside[start:start + 4] = True
    assert torch.equal(p.sde, inside)                           # ODE outside the window
    assert torch.equal(p.trained, inside.expand(2, 10))


def test_trained_index_pads_uneven_rows():
    trained = torch.tensor([[True, False, True, True], [False, True, False, False]])
    index, mask = trained_index(trained)
    assert index.tolist() == [[0, 2, 3], [1, 0, 0]] and mask.tolist() == [[1, 1, 1], [1, 0, 0]]


@pytest.mark.parametrize("cfg,key", [
    (TimestepsConfig(select="bogus"), "policy.timesteps.select"),
    (TimestepsConfig(select="first_k", k=11), "policy.timesteps.k"),
    (TimestepsConfig(select="fraction", fraction=0.0), "policy.timesteps.fraction"),
    (TimestepsConfig(select="window", window_size=12), "policy.timesteps.window_size"),
])
def test_invalid_settings_name_the_key(cfg, key):
    with pytest.raises(ValueError, match=key):
        validate(cfg, 10)


@pytest.mark.parametrize("override,needle", [
    ("policy.timesteps.k=9", "policy.timesteps.k"),
    ("policy.sde_schedule=ddpm", "policy.sde_schedule"),
    ("policy.lora.target_modules=[no_such_layer]", "policy.lora.target_modules"),
    ("policy.model=/no/such/folder", "policy.model"),
])
def test_cli_reports_policy_errors_without_a_traceback(override, needle, tmp_path, capsys, tiny_config):
    from mmrl.cli import main

    code = main(["train", tiny_config("sd3"), f"output_dir={tmp_path}", override])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and "Traceback" not in err, err


def test_kl_without_a_reference_is_a_config_error(tmp_path, capsys, tiny_config):
    from mmrl.cli import main

    code = main(["train", tiny_config("sd3"), f"output_dir={tmp_path}", "max_steps=1", "eval.every=0",
                 "policy.lora.rank=0", "policy.reference=false", "algo.kl_beta=0.1"])
    err = capsys.readouterr().err
    assert code == 2 and "policy.reference" in err and "Traceback" not in err, err
