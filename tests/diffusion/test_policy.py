"""The diffusion policy on tiny models, in-process: on-policy ratio, stored state, noise sharing,
prompt encoding, KL, evaluation and parity of the ODE sampler with the diffusers pipelines."""

import numpy as np
import pytest
import torch
from PIL import Image

from diffusion.families.common import predict
from mmrl.types import select
from rewards.sample import Video

FAMILIES = ["sd3", "sd", "sd_v", "flux", "wan"]
TEXTS = ["a red circle", "a blue square"]


@pytest.fixture(scope="module", params=FAMILIES)
def rolled(request, build_tiny, perturb_lora, prompts):
    """A perturbed-LoRA policy of each family and one rollout of 2 prompts x 3 samples."""
    policy = build_tiny(request.param, "timesteps.select=all", "forward_batch=4")
    perturb_lora(policy)
    return policy, policy.rollout(prompts(TEXTS), group_size=3)


def test_rollout_shapes_and_samples(rolled):
    policy, ro = rolled
    s = policy.cfg.rollout_steps
    assert ro.log_probs.shape == ro.mask.shape == (6, s) and bool((ro.mask == 1).all())
    assert ro.group.tolist() == [0, 0, 0, 1, 1, 1] and ro.group_size == 3
    kind = Video if policy.family.video else Image.Image
    assert all(isinstance(x.output, kind) and x.images == [] for x in ro.samples)
    assert [x.prompt for x in ro.samples] == [TEXTS[0]] * 3 + [TEXTS[1]] * 3
    assert torch.isfinite(ro.log_probs).all() and bool((ro.log_probs != 0).all())


def test_on_policy_ratio_is_exactly_one(rolled):
    """Re-scoring with other batch compositions reproduces the rollout log-probs bit for bit."""
    policy, ro = rolled
    for idx in (torch.tensor([4, 0, 5]), torch.tensor([2]), torch.arange(6).flip(0)):
        new = policy.log_probs(ro, idx).log_probs
        assert torch.equal(new, ro.log_probs[idx]), (new - ro.log_probs[idx]).abs().max()


@pytest.mark.parametrize("plan", [["timesteps.select=fraction", "timesteps.fraction=0.5"],
                                  ["timesteps.select=window", "timesteps.window_size=2", "timesteps.window_stride=0"]])
def test_on_policy_ratio_is_exactly_one_when_samples_train_some_steps(plan, build_tiny, perturb_lora, prompts):
    """Per-sample random subsets (each sample's own trained steps) and an SDE window followed by ODE steps:
    the rollout scores its trained transitions after the loop, re-scoring reproduces them bit for bit."""
    policy = build_tiny("sd3", *plan, "forward_batch=4")
    perturb_lora(policy)
    ro = policy.rollout(prompts(TEXTS), group_size=3)
    assert ro.log_probs.shape[1] == 2 and bool((ro.mask == 1).all()) and bool((ro.log_probs != 0).all())
    steps = ro.state["step_index"]                                           # [6, 2]
    if plan[0].endswith("fraction"):
        assert len({tuple(r) for r in steps.tolist()}) > 1, steps             # not the same steps for all
    else:
        assert bool((steps == torch.tensor([0, 1])).all()), steps
    for idx in (torch.tensor([4, 0, 5]), torch.tensor([2]), torch.arange(6).flip(0)):
        new = policy.log_probs(ro, idx).log_probs
        assert torch.equal(new, ro.log_probs[idx]), (new - ro.log_probs[idx]).abs().max()


def test_log_probs_have_gradients(rolled):
    policy, ro = rolled
    policy.log_probs(ro, torch.tensor([1, 3])).log_probs.sum().backward()
    grads = [p.grad for p in policy.trainable_parameters()]
    assert any(g is not None and bool(g.abs().sum() > 0) for g in grads)
    for p in policy.trainable_parameters():
        p.grad = None


def test_exact_kl_to_reference(rolled):
    """The reference (its SDE-step means) is an explicit input: handed back, it adds the exact KL;
    without it log_probs gives no KL and the same log-probs (nothing cached in between)."""
    policy, ro = rolled
    ref = policy.reference_log_probs(ro, torch.arange(6))
    assert ref.log_probs is None and ref.state["mean"].shape[:2] == (6, policy.cfg.rollout_steps)
    idx = torch.tensor([4, 0, 2])
    scores = policy.log_probs(ro, idx, ref.select(idx))
    assert scores.kl.shape == (3, policy.cfg.rollout_steps) and bool((scores.kl >= 0).all())
    assert float(scores.kl.detach().sum()) > 0  # perturbed LoRA vs the adapter disabled
    plain = policy.log_probs(ro, idx)
    assert plain.kl is None and torch.equal(plain.log_probs, scores.log_probs)
    alone = policy.log_probs(ro, idx[:1], policy.reference_log_probs(ro, idx[:1]))
    assert torch.equal(alone.kl, scores.kl[:1])                              # per sample, batch-independent


def test_kl_is_zero_at_the_lora_start(build_tiny, prompts):
    policy = build_tiny("sd3")
    ro = policy.rollout(prompts(TEXTS[:1]), group_size=2)
    ref = policy.reference_log_probs(ro, torch.arange(2))
    assert torch.equal(policy.log_probs(ro, torch.arange(2), ref).kl, torch.zeros(2, 3))


@pytest.mark.parametrize("kind", ["sd3", "flux"])
def test_state_keeps_only_needed_latents(kind, build_tiny, prompts):
    """A window of 2 of 6 steps stores 3 latents per sample, not S + 1 = 7."""
    policy = build_tiny(kind, "rollout_steps=6", "timesteps.select=window", "timesteps.window_size=2")
    ro = policy.rollout(prompts(TEXTS[:1], step=3), group_size=2)
    lat = ro.state["latents"]                                               # [N, U, ...]
    assert lat.shape[1] == 3
    per_latent = lat[0, 0].numel() * lat.element_size()
    stored = sum(v.numel() * v.element_size() for v in ro.state.values() if torch.is_tensor(v))
    assert stored < 0.5 * ro.log_probs.shape[0] * 7 * per_latent
    assert ro.state["step_index"].tolist() == [[3, 4], [3, 4]]              # window start 3 at step 3
    # a trained step's output slot is the next one's input slot (chain deduplicated)
    assert torch.equal(ro.state["after"][:, 0], ro.state["before"][:, 1])


def test_shared_noise_within_groups_only(build_tiny, prompts):
    policy = build_tiny("sd3", "shared_noise=true", "timesteps.select=all")
    ro = policy.rollout(prompts(TEXTS), group_size=2)
    x0 = ro.state["latents"][:, 0]                                          # x_S, the initial noise
    assert torch.equal(x0[0], x0[1]) and torch.equal(x0[2], x0[3]) and not torch.equal(x0[0], x0[2])
    assert not torch.equal(ro.state["latents"][0, -1], ro.state["latents"][1, -1])  # SDE noise differs
    private = build_tiny("sd3", "shared_noise=false", "timesteps.select=all").rollout(prompts(TEXTS), group_size=2)
    assert not torch.equal(private.state["latents"][0, 0], private.state["latents"][1, 0])


def test_sampling_depends_on_the_prompt_seed_only(build_tiny, prompts):
    """Rank independence: a prompt's samples do not change with the other prompts of the batch."""
    policy = build_tiny("sd3")
    both = policy.rollout(prompts(TEXTS, seeds=[7, 8]), group_size=2)
    alone = policy.rollout(prompts(TEXTS[1:], seeds=[8]), group_size=2)
    assert torch.equal(select(both, torch.tensor([2, 3])).state["latents"], alone.state["latents"])
    assert torch.equal(both.log_probs[2:], alone.log_probs)


def _count_rows(module, calls):
    forward = module.forward

    def counted(input_ids=None, *args, **kwargs):
        calls.append(input_ids.shape[0])
        return forward(input_ids, *args, **kwargs)

    module.forward = counted


@pytest.mark.parametrize("kind", ["sd3", "flux", "sd"])
def test_text_encoders_run_once_per_prompt(kind, build_tiny, prompts):
    policy = build_tiny(kind)
    pipe = policy.family.pipe
    encoders = [m for m in (pipe.text_encoder, getattr(pipe, "text_encoder_2", None),
                            getattr(pipe, "text_encoder_3", None)) if m is not None]
    calls = {i: [] for i in range(len(encoders))}
    for i, m in enumerate(encoders):
        _count_rows(m, calls[i])
    ro = policy.rollout(prompts(TEXTS + TEXTS[:1]), group_size=3)           # 3 prompts, 2 distinct
    assert all(sum(c) == 2 for c in calls.values()), calls
    policy.reference_log_probs(ro, torch.arange(9))
    policy.log_probs(ro, torch.arange(9))
    assert all(sum(c) == 2 for c in calls.values()), calls                   # updates reuse them
    assert ro.state["cond"][0] is ro.state["cond"][1] is ro.state["cond"][6]


def test_generate_eval_is_deterministic_ode(build_tiny, prompts):
    policy = build_tiny("sd3")
    a = policy.generate_eval(prompts(TEXTS, seeds=[3, 4], step=-1))
    b = policy.generate_eval(prompts(TEXTS, seeds=[3, 4], step=-1))
    assert [x.prompt for x in a] == TEXTS and all(isinstance(x.output, Image.Image) for x in a)
    assert len(a) == len(b) == len(TEXTS)
    assert all(np.array_equal(np.asarray(x.output), np.asarray(y.output)) for x, y in zip(a, b, strict=True))


def test_eval_guidance_scale_changes_only_the_evaluation_images(build_tiny, prompts):
    """Training without CFG (guidance_scale 1) and evaluating with it: the eval images are those of a
    policy trained at the eval scale, the rollouts those of a policy at scale 1."""
    def images(samples):
        return [np.asarray(s.output) for s in samples]

    batch, evals = prompts(TEXTS, seeds=[3, 4], step=-1), prompts(TEXTS, seeds=[3, 4], step=-1)
    split = build_tiny("sd3", "guidance_scale=1.0", "eval_guidance_scale=4.5")
    plain, cfg = build_tiny("sd3", "guidance_scale=1.0"), build_tiny("sd3", "guidance_scale=4.5")
    got, want, other = images(split.generate_eval(evals)), images(cfg.generate_eval(evals)), images(plain.generate_eval(evals))
    assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    assert not all(np.array_equal(a, b) for a, b in zip(got, other, strict=True))
    ro_split, ro_plain = split.rollout(batch, group_size=2), plain.rollout(batch, group_size=2)
    assert torch.equal(ro_split.log_probs, ro_plain.log_probs)


@pytest.mark.parametrize("kind", FAMILIES)
def test_ode_sampler_matches_the_diffusers_pipeline(kind, build_tiny):
    """Zero noise through our predict / schedule equals the pipeline's own loop from the same latents."""
    from diffusion.sampler import Denoiser, denoise
    from diffusion.timesteps import StepPlan

    policy = build_tiny(kind, "lora.rank=0", "reference=false")
    fam, steps, g = policy.family, 5, policy.cfg.guidance_scale
    if kind == "wan":  # the pipeline's loop is Euler only with Euler's scheduler (Wan ships UniPC: a multistep update)
        from diffusers import FlowMatchEulerDiscreteScheduler

        fam.pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=3.0)
    x = fam.noise(1, torch.Generator().manual_seed(0))
    sched = fam.schedule(steps, policy.cfg.sde_schedule)
    ode = StepPlan(sde=torch.zeros(steps, dtype=torch.bool), trained=torch.zeros(1, steps, dtype=torch.bool))
    with torch.no_grad():
        ours = denoise(Denoiser(fam, policy.model, sched, g, 4), x, list(policy.encode(TEXTS[:1]).values()),
                       ode, 0.0, None).final
    kwargs = dict(height=fam.height, width=fam.width) if kind in ("flux", "wan") else {}
    if kind == "wan":
        kwargs["num_frames"] = fam.num_frames
    if kind in ("sd3", "flux", "wan"):
        kwargs["max_sequence_length"] = policy.cfg.max_sequence_length
    if kind in ("sd", "sd_v"):
        kwargs["eta"] = 0.0
    out = fam.pipe(TEXTS[0], latents=x.clone(), num_inference_steps=steps, guidance_scale=g, output_type="latent",
                   **kwargs)
    ref = out.frames if kind == "wan" else out.images
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)


def test_predict_rows_do_not_depend_on_their_batch(build_tiny):
    """The padded fixed-size chunks make one row's output independent of the rows around it."""
    policy = build_tiny("sd", "lora.rank=0", "reference=false")
    fam = policy.family
    x = fam.noise(5, torch.Generator().manual_seed(0))
    idx = torch.tensor([0, 1, 2, 3, 0])
    conds = list(policy.encode(["a red circle"] * 5).values()) * 5
    with torch.no_grad():
        full = predict(fam, policy.model, x, idx, conds, policy.sched, 4.5, 4)
        one = predict(fam, policy.model, x[3:4], idx[3:4], conds[:1], policy.sched, 4.5, 4)
    assert torch.equal(full[3:4], one)


def test_gradient_checkpointing_gives_the_same_gradients(build_tiny, perturb_lora, prompts):
    grads = []
    for flag in ("false", "true"):
        policy = build_tiny("sd3", f"gradient_checkpointing={flag}")
        perturb_lora(policy)
        ro = policy.rollout(prompts(TEXTS[:1]), group_size=2)
        policy.log_probs(ro, torch.arange(2)).log_probs.sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.trainable_parameters()]))
    torch.testing.assert_close(grads[0], grads[1])
