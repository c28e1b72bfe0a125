"""mmrl's SDE rollout (with log-probs) against the diffusers pipeline's own sampling.

Same tiny model, prompts, images (videos: the tiny Wan's 9-frame clips) per prompt, steps and guidance; both
decode to PIL images (frames), all of a call's samples in one VAE call.
mmrl also records the per-step log-probs, stores the trained steps' latents, and builds
reward samples. Text encoding is matched on both sides: the empty negative prompt is encoded once
for each, and mmrl's prompt cache (policy.text_cache_size) is timed in its two regimes against a
pipeline doing the same encoding work:

    first visit   mmrl's cache emptied before each call (every prompt encoded, alone) against the
                  pipeline encoding the prompts in the call;
    steady state  mmrl's cache warm (a prompt set that repeats: second and later visits) against the
                  pipeline given the prompt embeddings computed once, so neither side encodes text.

A third ratio puts the warm rollout against the pipeline encoding its prompts on every call, as an
RL loop around the pipeline does (Flow-GRPO encodes each step's prompts, the negative one once).
Goal: steady-state mmrl / diffusers <= 1.0.

    python benchmarks/diffusion_rollout.py [--repeats 10] [--steps 10] [--group 8]
"""

from __future__ import annotations

import torch

from common import Report, diffusion_options, interleaved, machine, median, run, table, tiny_diffusion_policy
from mmrl.types import PromptBatch

PROMPTS = ["a red circle", "two blue squares"]


@torch.no_grad()
def embeddings(pipe, kind: str, group: int, max_sequence_length: int) -> tuple[dict, dict]:
    """The pipeline's own encodings for a call on PROMPTS, computed once: (negative only, prompts and
    negative); the images are the same as when the pipeline encodes them in the call. SD's pipeline
    repeats given embeddings per image itself, SD3's and Wan's take them per image (and then draw
    num_images_per_prompt / num_videos_per_prompt samples per given row, so they are called with 1)."""
    if kind == "sd":
        pos, neg = pipe.encode_prompt(PROMPTS, pipe.device, 1, True)
        return {"negative_prompt_embeds": neg}, {"prompt_embeds": pos, "negative_prompt_embeds": neg}
    if kind == "wan":
        pos, neg = pipe.encode_prompt(PROMPTS, do_classifier_free_guidance=True, num_videos_per_prompt=group,
                                      max_sequence_length=max_sequence_length)
        return {"negative_prompt_embeds": neg}, {"prompt_embeds": pos, "negative_prompt_embeds": neg}
    pos, neg, pos_pooled, neg_pooled = pipe.encode_prompt(PROMPTS, None, None, num_images_per_prompt=group,
                                                          do_classifier_free_guidance=True,
                                                          max_sequence_length=max_sequence_length)
    negative = {"negative_prompt_embeds": neg, "negative_pooled_prompt_embeds": neg_pooled}
    return negative, {"prompt_embeds": pos, "pooled_prompt_embeds": pos_pooled, **negative}


def contenders(kind: str, steps: int, group: int) -> dict:
    n = len(PROMPTS) * group   # N images; CFG doubles the denoiser rows, not the VAE's
    policy, cfg = tiny_diffusion_policy(kind, [f"policy.rollout_steps={steps}", "policy.timesteps.select=all",
                                               f"policy.forward_batch={2 * n}", f"policy.decode_batch={n}"])
    pipe = policy.family.pipe
    batch = PromptBatch(rows=[{"prompt": p} for p in PROMPTS], index=[0, 1], seeds=[1, 2], step=0)
    negative, both = embeddings(pipe, kind, group, cfg.policy.max_sequence_length)

    def cold():
        policy.text_cache.clear()
        return policy.rollout(batch, group)

    def warm():
        return policy.rollout(batch, group)

    def pipeline(prompt, given: dict):
        per_prompt = 1 if prompt is None and kind != "sd" else group

        def call():
            kwargs = dict(prompt=prompt, num_inference_steps=steps, guidance_scale=cfg.policy.guidance_scale,
                          generator=torch.Generator().manual_seed(1), output_type="pil", **given)
            if kind != "sd":
                kwargs["max_sequence_length"] = cfg.policy.max_sequence_length
            if kind == "wan":
                fam = policy.family
                kwargs.update(num_videos_per_prompt=per_prompt, height=fam.height, width=fam.width,
                              num_frames=fam.num_frames)
                return pipe(**kwargs).frames
            return pipe(num_images_per_prompt=per_prompt, **kwargs).images
        return call

    return {"mmrl, first visit": cold, "mmrl, steady state": warm,
            "pipeline, encodes prompts": pipeline(PROMPTS, negative),
            "pipeline, prompt embeds given": pipeline(None, both)}


def measure(args) -> Report:
    rows, summary = [], []
    for kind in ("sd3", "sd", "wan"):
        t = {name: median(ts) for name, ts in interleaved(contenders(kind, args.steps, args.group),
                                                          repeats=args.repeats).items()}
        rows += [[kind, name, s] for name, s in t.items()]
        summary.append([kind, t["mmrl, first visit"] / t["pipeline, encodes prompts"],
                        t["mmrl, steady state"] / t["pipeline, prompt embeds given"],
                        t["mmrl, steady state"] / t["pipeline, encodes prompts"]])
    what = (f"{len(PROMPTS)} prompts x {args.group} images (wan: 9-frame 32 x 32 clips), {args.steps} steps, CFG "
            f"({machine()})")
    ratios = table("mmrl / diffusers", ["family", "first visit", "steady state", "steady vs encoding pipeline"],
                   summary)
    worst = max(summary, key=lambda r: r[2])
    return Report([table(f"diffusion rollout, {what}", ["family", "contender", "median s"], rows), ratios],
                  f"mmrl rollout / diffusers sampling, steady state = {worst[2]:.3f} at {worst[0]} (worst family; "
                  f"goal <= 1.0); first visit: " + ", ".join(f"{r[0]} {r[1]:.3f}" for r in summary))


if __name__ == "__main__":
    run(__doc__, diffusion_options, measure)
