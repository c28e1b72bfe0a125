"""mmrl's SDE rollout (with log-probs) against the diffusers pipeline's own sampling.

Same tiny model, prompts, images per prompt, steps and guidance; both decode to PIL images.
mmrl also records the per-step log-probs, stores the trained steps' latents, and builds
reward samples. Goal: mmrl / diffusers <= 1.03.

    python benchmarks/diffusion_rollout.py [--repeats 10] [--steps 10] [--group 8]
"""

from __future__ import annotations

import argparse

import torch

from common import interleaved, machine, median, table, tiny_diffusion_policy
from mmrl.types import PromptBatch

PROMPTS = ["a red circle", "two blue squares"]


def contenders(kind: str, steps: int, group: int):
    policy, cfg = tiny_diffusion_policy(kind, [f"policy.rollout_steps={steps}", "policy.timesteps.select=all",
                                               f"policy.forward_batch={2 * len(PROMPTS) * group}"])
    pipe = policy.family.pipe
    batch = PromptBatch(rows=[{"prompt": p} for p in PROMPTS], index=[0, 1], seeds=[1, 2], step=0)

    def mmrl_rollout():
        return policy.rollout(batch, group)

    def diffusers_pipeline():
        gen = torch.Generator().manual_seed(1)
        kwargs = dict(prompt=PROMPTS, num_images_per_prompt=group, num_inference_steps=steps,
                      guidance_scale=cfg.policy.guidance_scale, generator=gen, output_type="pil")
        if kind != "sd":
            kwargs["max_sequence_length"] = cfg.policy.max_sequence_length
        return pipe(**kwargs).images

    return {"mmrl rollout (SDE + log-probs)": mmrl_rollout, "diffusers pipeline": diffusers_pipeline}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--group", type=int, default=8)
    args = ap.parse_args()
    torch.manual_seed(0)
    rows, ratios = [], []
    for kind in ("sd3", "sd"):
        times = interleaved(contenders(kind, args.steps, args.group), repeats=args.repeats)
        (a, ta), (b, tb) = times.items()
        ratio = median(ta) / median(tb)
        ratios.append(ratio)
        rows += [[kind, a, median(ta), ratio], [kind, b, median(tb), 1.0]]
    print(table(f"diffusion rollout, {len(PROMPTS)} prompts x {args.group} images, {args.steps} steps, CFG "
                f"({machine()})", ["family", "contender", "median s", "ratio"], rows))
    print(f"headline: mmrl rollout / diffusers sampling = {max(ratios):.3f} (worst family; goal <= 1.03)")


if __name__ == "__main__":
    main()
