"""DiffusionNFT on the diffusion policy (diffusion/nft.py): the old policy's soft update and swap, the
rollout that keeps only clean latents, the seeded forward-process loss and its start-of-step gradient,
CFG-free training, the KL to the reference, the old weights in checkpoints and the config errors."""

import pytest
import torch

from diffusion import nft
from mmrl.config import ConfigError, load_config
from mmrl.algorithms.objectives.nft import NFTSpec

TEXTS = ["a red circle", "a blue square"]


@pytest.fixture(scope="module")
def build(build_tiny):
    """`build(*overrides, kl_beta=0.0)`: the tiny SD3 (forward_batch=4) built for DiffusionNFT."""
    return lambda *overrides, kl_beta=0.0: build_tiny("sd3", "forward_batch=4", *overrides, kl_beta=kl_beta,
                                                      objective="nft")


def loss_of(policy, ro, idx, r, **spec):
    return policy.forward_process_loss(ro, torch.tensor(idx), torch.tensor(r), NFTSpec(timesteps=2, **spec))


# ---------------------------------------------------------------- the old policy


def linear_old():
    lin = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[1.0, 2.0]]))
    return lin, nft.OldPolicy(lin)


def test_soft_update_table():
    lin, old = linear_old()                                          # old = theta = [1, 2] at build
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[3.0, 6.0]]))
    old.update(0.25)                                                 # 0.25 [1, 2] + 0.75 [3, 6] = [2.5, 5]
    torch.testing.assert_close(old.old[0], torch.tensor([[2.5, 5.0]]), rtol=0, atol=0)
    old.update(0.5)                                                  # 0.5 [2.5, 5] + 0.5 [3, 6] = [2.75, 5.5]
    torch.testing.assert_close(old.old[0], torch.tensor([[2.75, 5.5]]), rtol=0, atol=0)
    old.update(0.0)                                                  # decay 0: old = theta exactly
    assert torch.equal(old.old[0], lin.weight.detach())


def test_active_swaps_in_the_old_weights_and_restores_the_trained_ones_exactly():
    lin, old = linear_old()
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[0.1, 0.7]]))
    x = torch.tensor([[1.0, 1.0]])
    with old.active():
        assert lin(x).item() == 3.0                                  # 1 + 2, the old weights
    assert torch.equal(lin.weight.detach(), torch.tensor([[0.1, 0.7]]))
    assert torch.equal(old.old[0], torch.tensor([[1.0, 2.0]]))


def test_only_trainable_parameters_are_copied():
    lin = torch.nn.Linear(2, 1)
    lin.bias.requires_grad_(False)
    assert nft.OldPolicy(lin).names == ["weight"]


# ---------------------------------------------------------------- rollout and loss on tiny SD3


@pytest.fixture(scope="module")
def rolled(build, prompts):
    policy = build()
    return policy, policy.rollout(prompts(TEXTS), group_size=2)


def test_rollout_keeps_clean_latents_and_seeds_only(rolled):
    _, ro = rolled
    assert ro.log_probs is None and ro.mask.shape == (4, 1) and bool((ro.mask == 1).all())
    assert set(ro.state) == {"x0", "cond", "seed"}
    assert ro.state["x0"].shape[0] == 4 and len(ro.state["cond"]) == 4
    assert ro.state["seed"].tolist() == nft.sample_seeds([1000, 1001], 2).tolist()
    assert len(set(ro.state["seed"].tolist())) == 4


def test_the_old_policy_samples_the_rollouts(build, perturb_lora, prompts):
    policy = build("noise_level=0.0")                                # the ODE sampler: no SDE noise at all
    first = policy.rollout(prompts(TEXTS), 2).state["x0"]
    perturb_lora(policy)                                             # train theta; old stays at the start
    assert torch.equal(policy.rollout(prompts(TEXTS), 2).state["x0"], first)
    policy.update_old(0.0)                                           # old <- theta
    assert not torch.equal(policy.rollout(prompts(TEXTS), 2).state["x0"], first)


def test_loss_is_seeded_per_sample_and_independent_of_the_microbatch(rolled):
    policy, ro = rolled
    with torch.no_grad():
        all4 = loss_of(policy, ro, [0, 1, 2, 3], [0.9, 0.1, 0.5, 0.7]).loss
        again = loss_of(policy, ro, [2, 0], [0.5, 0.9]).loss
        other_epoch = loss_of(policy, ro, [0, 1, 2, 3], [0.9, 0.1, 0.5, 0.7], draw=1).loss
    assert all4.shape == (4,) and bool(torch.isfinite(all4).all())
    torch.testing.assert_close(again, all4[[2, 0]], rtol=0, atol=0)  # same draws, same forwards, any batch
    assert not torch.equal(other_epoch, all4)                        # another epoch draws other t and noise


def test_at_the_start_of_a_step_r_one_half_gives_no_gradient(build, perturb_lora, prompts):
    # old == theta: d loss / d v_theta = (2r - 1) x the flow-matching gradient (tests/core/test_nft.py)
    policy = build()
    perturb_lora(policy)                                             # B != 0, so the LoRA gets gradients
    policy.update_old(0.0)
    ro = policy.rollout(prompts(TEXTS[:1]), 2)
    params = policy.trainable_parameters()
    grads = []
    for r in (0.5, 1.0):
        out = loss_of(policy, ro, [0, 1], [r, r])
        grads.append(torch.autograd.grad(out.loss.sum(), params))
        torch.testing.assert_close(out.metrics["nft/old_deviate"].value, torch.tensor(0.0))
    assert max(float(g.abs().max()) for g in grads[0]) < 1e-6
    assert max(float(g.abs().max()) for g in grads[1]) > 1e-4


def test_the_loss_is_cfg_free(rolled, build):
    policy, ro = rolled
    with torch.no_grad():
        with_cfg = loss_of(policy, ro, [0, 1], [0.8, 0.2]).loss      # sd3_tiny.yaml: guidance_scale 4.5
    unguided = build("guidance_scale=1.0")
    unguided.denoiser.load_state_dict(policy.denoiser.state_dict())
    unguided.nft_old.old = [o.clone() for o in policy.nft_old.old]
    with torch.no_grad():
        torch.testing.assert_close(loss_of(unguided, ro, [0, 1], [0.8, 0.2]).loss, with_cfg, rtol=0, atol=0)


def test_kl_to_the_reference_is_zero_at_the_start_and_grows_with_training(build, perturb_lora, prompts):
    policy = build(kl_beta=0.01)
    ro = policy.rollout(prompts(TEXTS[:1]), 2)
    assert loss_of(policy, ro, [0, 1], [0.5, 0.5]).kl is None        # not asked for
    start = loss_of(policy, ro, [0, 1], [0.5, 0.5], kl=True).kl      # LoRA B = 0: theta == reference
    assert start.shape == (2,) and float(start.detach().abs().max()) == 0.0
    perturb_lora(policy)
    assert float(loss_of(policy, ro, [0, 1], [0.5, 0.5], kl=True).kl.detach().min()) > 0


def test_old_weights_are_saved_next_to_the_policy_and_loaded_back(tmp_path, build, perturb_lora):
    policy = build()
    perturb_lora(policy)
    policy.update_old(0.5)
    saved = [o.clone() for o in policy.nft_old.old]
    path = str(tmp_path / "policy.safetensors")
    policy.save(path)
    assert (tmp_path / "policy.nft_old.safetensors").is_file()
    policy.update_old(0.0)
    policy.load(path)
    assert all(torch.equal(a, b) for a, b in zip(policy.nft_old.old, saved))
    (tmp_path / "policy.nft_old.safetensors").unlink()
    with pytest.raises(ValueError, match="policy.nft_old.safetensors is missing"):
        policy.load(path)


# ---------------------------------------------------------------- config errors


def _error(config, *overrides):
    with pytest.raises(ConfigError) as e:
        load_config(config, list(overrides))
    return str(e.value)


def test_a_ddim_family_is_a_config_error_naming_the_objective(tiny_config):
    msg = _error(tiny_config("sd"), "algo.objective=nft", "algo.kl_beta=0")
    assert "algo.objective" in msg and "DDIM" in msg and "flow-matching" in msg


def test_more_flow_times_than_rollout_steps_is_a_config_error(tiny_config):
    msg = _error(tiny_config("sd3"), "algo.objective=nft", "algo.nft.timesteps=5")
    assert "algo.nft.timesteps" in msg and "rollout_steps=4" in msg


def test_the_tiny_configs_load_with_nft(tiny_config):
    cfg = load_config(tiny_config("sd3"), ["algo.objective=nft", "algo.nft.timesteps=4"])
    assert cfg.algo.objective == "nft"
    assert load_config(tiny_config("flux"), ["algo.objective=nft"]).algo.objective == "nft"
