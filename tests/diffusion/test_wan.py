"""The Wan 2.1 text-to-video family (diffusion/families/wan.py) on the tiny Wan: video latents and samples,
decoding a clip at a time, the schedule of the pipeline's UniPC scheduler, prompt padding, frames equal to the
diffusers pipeline's, rank independence, and the checks of its settings (families shared with the images are
covered in test_policy.py: ratio exactly 1, KL, gradients, ODE parity)."""

import numpy as np
import pytest
import torch

from mmrl.config import ConfigError, load_config
from mmrl.types import select
from rewards.sample import Video

TEXTS = ["a red circle", "a blue square"]


@pytest.fixture(scope="module")
def wan(build_tiny):
    return build_tiny("wan", "timesteps.select=all", "forward_batch=4")


def test_rollout_holds_video_latents_and_returns_clips(wan, prompts):
    ro = wan.rollout(prompts(TEXTS), group_size=2)
    assert ro.state["latents"].shape[2:] == (16, 3, 4, 4)                   # [N, U, C, F', h, w]: 9 frames, 32 px
    clips = [s.output for s in ro.samples]
    assert all(isinstance(c, Video) and len(c) == 9 and c.size == (32, 32) and c.fps == 8 for c in clips)
    first = [np.asarray(f) for f in clips[0].frames]
    assert any(not np.array_equal(first[0], f) for f in first[1:])        # frames differ: a video, not a still


def test_clips_are_decoded_one_at_a_time_by_default(wan, prompts):
    calls, decode = [], wan.family.pipe.vae.decode

    def counted(z, *args, **kwargs):
        calls.append(tuple(z.shape))
        return decode(z, *args, **kwargs)

    wan.family.pipe.vae.decode = counted
    try:
        wan.rollout(prompts(TEXTS[:1]), group_size=3)
    finally:
        wan.family.pipe.vae.decode = decode
    assert calls == [(1, 16, 3, 4, 4)] * 3


def test_schedule_is_the_pipelines_unipc_sigmas_and_timesteps(wan):
    """Flow-GRPO's Wan trainer steps the SDE over UniPC's flow sigmas (first 1 - 1e-6, shift 3) and feeds the
    transformer UniPC's integer timesteps, as the pipeline does."""
    scheduler = wan.family.pipe.scheduler
    sched = wan.family.schedule(4, "linear")
    scheduler.set_timesteps(4)
    assert type(scheduler).__name__ == "UniPCMultistepScheduler"
    assert torch.equal(sched.coef, scheduler.sigmas[:-1].float()) and torch.equal(sched.coef_next, scheduler.sigmas[1:])
    assert torch.equal(sched.model_t, scheduler.timesteps.float()) and float(sched.coef_next[-1]) == 0.0
    assert 1 - 1e-5 < float(sched.coef[0]) < 1


def test_linear_noise_uses_the_schedules_second_sigma(wan):
    """g = sigma_1 sigma (sigma_min 0): the first step's std is sigma_1 sigma_0 sqrt(sigma_0 - sigma_1)."""
    sched = wan.family.schedule(4, "linear")
    s0, s1 = float(sched.coef[0]), float(sched.coef[1])
    std = sched.coefs(1.0).std                                              # [S]
    assert float(std[0]) == pytest.approx(s1 * s0 * (s0 - s1) ** 0.5, rel=1e-6)


def test_prompts_are_zero_padded_to_max_sequence_length(wan):
    cond = wan.encode(["a red circle"])["a red circle"]
    emb = cond.tensors["embeds"]                                            # [L, D]
    assert emb.shape == (8, 32)
    assert bool((emb[4:] == 0).all()) and bool((emb[:4] != 0).any(dim=1).all())  # 3 words + </s>, then zeros


def test_frames_equal_the_diffusers_pipelines(build_tiny):
    """Zero noise, Euler's scheduler in the pipeline: our denoising and decoding give the pipeline's frames."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    from diffusion.sampler import Denoiser, denoise
    from diffusion.timesteps import StepPlan

    policy = build_tiny("wan", "lora.rank=0", "reference=false")
    fam = policy.family
    fam.pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    x = fam.noise(1, torch.Generator().manual_seed(0))
    sched = fam.schedule(4, "linear")
    ode = StepPlan(sde=torch.zeros(4, dtype=torch.bool), trained=torch.zeros(1, 4, dtype=torch.bool))
    with torch.no_grad():
        final = denoise(Denoiser(fam, policy.model, sched, 4.5, 4), x, list(policy.encode(TEXTS[:1]).values()), ode,
                        0.0, None).final
    ours = fam.decode(final)[0]
    ref = fam.pipe(TEXTS[0], latents=x.clone(), num_inference_steps=4, guidance_scale=4.5, height=32, width=32,
                   num_frames=9, max_sequence_length=8, output_type="pil").frames[0]
    assert len(ref) == len(ours) == 9
    for a, b in zip(ours.frames, ref):
        assert np.abs(np.asarray(a, dtype=int) - np.asarray(b, dtype=int)).max() <= 1


def test_a_prompts_clips_do_not_depend_on_the_other_prompts(wan, prompts):
    both = wan.rollout(prompts(TEXTS, seeds=[7, 8]), group_size=2)
    alone = wan.rollout(prompts(TEXTS[1:], seeds=[8]), group_size=2)
    assert torch.equal(select(both, torch.tensor([2, 3])).state["latents"], alone.state["latents"])
    assert torch.equal(both.log_probs[2:], alone.log_probs)
    assert all(np.array_equal(np.asarray(a), np.asarray(b))
               for x, y in zip(both.samples[2:], alone.samples) for a, b in zip(x.output.frames, y.output.frames))


@pytest.mark.parametrize("override,match", [("num_frames=8", "policy.num_frames': the Wan VAE needs 4k \\+ 1 frames"),
                                            ("height=36", "must be multiples of 16"),
                                            ("sde_schedule=flow_grpo", "latent coefficient .* <= 0"),
                                            ("num_frames=-1", "'policy.num_frames' must be >= 0")])
def test_bad_video_settings_name_their_key(override, match, build_tiny):
    with pytest.raises((ConfigError, ValueError), match=match):
        build_tiny("wan", override, "noise_level=0.7")


def test_frames_of_an_image_family_are_refused_at_load(tiny_config):
    with pytest.raises(ValueError, match="'policy.num_frames' is for video families"):
        load_config(tiny_config("sd3"), ["policy.family=sd3", "policy.num_frames=9"])


def test_frames_of_an_image_model_are_refused_when_it_is_known(build_tiny):
    with pytest.raises(ConfigError, match="image family 'sd3'"):
        build_tiny("sd3", "num_frames=9")
