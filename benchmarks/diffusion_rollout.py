"""mmrl's SDE rollout (with log-probs) against the diffusers pipeline's own sampling.

Same tiny model, prompts, images per prompt, steps and guidance; both decode to PIL images.
mmrl also records the per-step log-probs, stores the trained steps' latents, and builds
reward samples. Goal: mmrl / diffusers <= 1.03.

    python benchmarks/diffusion_rollout.py [--repeats 10] [--steps 10] [--group 8]
"""

from __future__ import annotations

import torch

from common import Report, diffusion_options, interleaved, machine, pair_rows, run, table, tiny_diffusion_policy
from mmrl.types import PromptBatch

PROMPTS = ["a red circle", "two blue squares"]


@torch.no_grad()
def negative_embeddings(pipe, kind: str, group: int, max_sequence_length: int) -> dict:
    """The pipeline's own encoding of the empty negative prompt for a call on PROMPTS (computed once; the
    images are the same as when the pipeline encodes it in the call). SD's pipeline repeats given
    negative embeddings per image itself, SD3's takes them per image."""
    if kind == "sd":
        _, neg = pipe.encode_prompt(PROMPTS, pipe.device, 1, True)
        return {"negative_prompt_embeds": neg}
    _, neg, _, neg_pooled = pipe.encode_prompt(PROMPTS, None, None, num_images_per_prompt=group,
                                               do_classifier_free_guidance=True,
                                               max_sequence_length=max_sequence_length)
    return {"negative_prompt_embeds": neg, "negative_pooled_prompt_embeds": neg_pooled}


def contenders(kind: str, steps: int, group: int):
    policy, cfg = tiny_diffusion_policy(kind, [f"policy.rollout_steps={steps}", "policy.timesteps.select=all",
                                               f"policy.forward_batch={2 * len(PROMPTS) * group}"])
    pipe = policy.family.pipe
    batch = PromptBatch(rows=[{"prompt": p} for p in PROMPTS], index=[0, 1], seeds=[1, 2], step=0)

    def mmrl_rollout():
        return policy.rollout(batch, group)

    # the empty negative prompt encoded once, as mmrl does: otherwise every pipeline call re-encodes it
    negative = negative_embeddings(pipe, kind, group, cfg.policy.max_sequence_length)

    def diffusers_pipeline():
        gen = torch.Generator().manual_seed(1)
        kwargs = dict(prompt=PROMPTS, num_images_per_prompt=group, num_inference_steps=steps,
                      guidance_scale=cfg.policy.guidance_scale, generator=gen, output_type="pil", **negative)
        if kind != "sd":
            kwargs["max_sequence_length"] = cfg.policy.max_sequence_length
        return pipe(**kwargs).images

    return {"mmrl rollout (SDE + log-probs)": mmrl_rollout, "diffusers pipeline": diffusers_pipeline}


def measure(args) -> Report:
    rows, ratios = [], []
    for kind in ("sd3", "sd"):
        pair, ratio = pair_rows(kind, interleaved(contenders(kind, args.steps, args.group), repeats=args.repeats))
        rows += pair
        ratios.append(ratio)
    title = (f"diffusion rollout, {len(PROMPTS)} prompts x {args.group} images, {args.steps} steps, CFG "
             f"({machine()})")
    return Report([table(title, ["family", "contender", "median s", "ratio"], rows)],
                  f"mmrl rollout / diffusers sampling = {max(ratios):.3f} (worst family; goal <= 1.03)")


if __name__ == "__main__":
    run(__doc__, diffusion_options, measure)
