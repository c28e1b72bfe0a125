"""One update over the trained steps against a raw denoiser forward+backward over the same inputs,
and the rollout memory of the timestep policies against storing every latent.

mmrl's update re-scores each stored transition through the one `predict` (CFG included), the SDE
log-prob and the clipped loss, then backpropagates; the floor feeds the same rows (same latents,
timesteps, text embeddings, CFG doubling) straight to the denoiser and backpropagates a sum.
Goal: mmrl / raw <= 1.10.

    python benchmarks/diffusion_update.py [--repeats 10] [--steps 10] [--group 8]
"""

from __future__ import annotations

import torch

from common import Report, diffusion_options, interleaved, machine, pair_rows, run, table, tiny_diffusion_policy
from diffusion.families.common import chunked_forward
from diffusion.sampler import transitions
from mmrl.algorithms.losses import LossSpec, policy_loss
from mmrl.types import PromptBatch

PROMPTS = ["a red circle", "two blue squares"]


def _rollout(policy, group: int):
    batch = PromptBatch(rows=[{"prompt": p} for p in PROMPTS], index=[0, 1], seeds=[1, 2], step=0)
    return policy.rollout(batch, group)


def contenders(kind: str, steps: int, group: int):
    rows_per_call = 2 * len(PROMPTS) * group
    policy, cfg = tiny_diffusion_policy(kind, [f"policy.rollout_steps={steps}", "policy.timesteps.select=all",
                                               f"policy.forward_batch={rows_per_call}", "algo.kl_beta=0"])
    ro = _rollout(policy, group)
    idx = torch.arange(len(ro))
    adv = torch.randn(len(ro))
    spec = LossSpec(clip_low=1e-4, clip_high=1e-4)
    fam, sched = policy.family, policy.sched
    _, _, x, _, st, conds = transitions(ro.state, ro.mask, idx)               # [M, ...] all trained steps
    cfg_rows = fam.model_rows(torch.cat([x, x]), torch.cat([st, st]), [fam.uncond] * len(conds) + conds,
                              sched, cfg.policy.guidance_scale)

    def mmrl_update():
        loss, _ = policy_loss(policy.log_probs(ro, idx), ro.log_probs, adv, ro.mask, None, spec)
        loss.backward()
        policy.denoiser.zero_grad(set_to_none=True)

    def raw_forward_backward():
        out = chunked_forward(lambda part: fam.forward(policy.model, part).float(), cfg_rows, rows_per_call)
        out.sum().backward()
        policy.denoiser.zero_grad(set_to_none=True)

    return {"mmrl update (re-score + loss + backward)": mmrl_update, "raw denoiser fwd+bwd": raw_forward_backward}


def memory(kind: str, steps: int, group: int) -> list[list]:
    """Bytes of stored latents per sample for each timestep policy, against all S + 1 latents."""
    rows = []
    for select, extra in (("all", []), ("fraction", ["policy.timesteps.fraction=0.6"]),
                          ("first_k", [f"policy.timesteps.k={max(1, steps - 1)}"]),
                          ("window", ["policy.timesteps.window_size=2"])):
        policy, _ = tiny_diffusion_policy(kind, [f"policy.rollout_steps={steps}", f"policy.timesteps.select={select}",
                                                 *extra])
        ro = _rollout(policy, group)
        lat = ro.state["latents"]                                             # [N, U, ...]
        per_sample = lat[0].numel() * lat.element_size()
        full = (steps + 1) * lat[0, 0].numel() * lat.element_size()
        rows.append([kind, select, lat.shape[1], per_sample, full, per_sample / full])
    return rows


def measure(args) -> Report:
    rows, ratios, mem = [], [], []
    for kind in ("sd3", "sd", "wan"):
        pair, ratio = pair_rows(kind, interleaved(contenders(kind, args.steps, args.group), repeats=args.repeats))
        rows += pair
        ratios.append(ratio)
        mem += memory(kind, args.steps, args.group)
    title = (f"diffusion update, {len(PROMPTS)} prompts x {args.group} images (wan: 9-frame clips) x {args.steps} "
             f"trained steps, CFG ({machine()})")
    return Report([table(title, ["family", "contender", "median s", "ratio"], rows),
                   table("rollout memory per sample (stored latents)",
                         ["family", "timesteps", "latents", "bytes", "all S+1 bytes", "fraction"], mem)],
                  f"mmrl update / raw denoiser fwd+bwd = {max(ratios):.3f} (worst family; goal <= 1.10)")


if __name__ == "__main__":
    run(__doc__, diffusion_options, measure)
