"""Pretrain the shapes-world text-to-image model (shapes_world/t2i_model.py), briefly and on purpose.

    python -m shapes_world.pretrain_t2i --seed 0 --out assets/tiny/shapes_t2i

Supervised conditional flow matching (rectified flow as in SD3, arXiv 2403.03206): for a target image
x0 (render_prompt of a random t2i_records("train") spec: an image that satisfies its prompt), noise e
and sigma ~ logit-normal(0, 1) (SD3's timestep sampling, section 3.1), the transformer sees
x_sigma = (1 - sigma) x0 + sigma e at timestep 1000 sigma and regresses v = e - x0. The three text
encoders are trained jointly (they start random); a prompt is replaced by "" with probability
`--drop` so the unconditional embedding of classifier-free guidance is learnt too.

Two phases, so that the RL default (configs/tiny/t2i_shapes.yaml) starts from a policy that is right
only some of the time, with a deficit a verifier reward can remove (like shapes_world.pretrain_vlm):
  1. `--iters` steps on targets that satisfy their prompts;
  2. `--bias-iters` steps where each target is, with probability `--bias`, washed out toward white
     by a random TINT fraction (a biased teacher), so the model paints pale shapes that the
     shapes_t2i verifier often does not recognise as the asked colour (it needs RGB distance < 90).
RL removes such a low-frequency deficit quickly; a deficit decided at the first, noisiest denoising
steps (drawing the wrong colour half of the time) barely moved in 40 RL steps when we tried it.
assets/tiny/shapes_t2i is the output of the command above (16 minutes on one CPU core; held-out score
0.19 after phase 2, about 0.55-0.6 after phase 1 in our runs).
The script prints
the loss every `--log-every` iterations and, at the end, the held-out score: the shapes_t2i reward of
that recipe's step-0 evaluation (its policy settings, eval prompts and eval seeds, run seed 0) on the
saved pipeline. The output is a diffusers folder (save_pretrained, safetensors), written to a
temporary folder beside `--out` and renamed into place.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time

import numpy as np
import torch

from shapes_world import t2i_model
from shapes_world.tasks import render_prompt, t2i_records

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "tiny", "t2i_shapes.yaml")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shapes_world.pretrain_t2i", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output pipeline folder (replaced if it exists)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights, the targets and the noise")
    p.add_argument("--iters", type=int, default=2500, help="phase 1: optimizer steps on true targets (the early stop)")
    p.add_argument("--bias-iters", type=int, default=300, help="phase 2: steps on targets washed out with prob --bias")
    p.add_argument("--bias", type=float, default=1.0, help="phase 2: probability a target is washed out (TINT)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the committed weights used 1)")
    p.add_argument("--init", default=None, help="start from this saved pipeline instead of a fresh one")
    p.add_argument("--batch", type=int, default=64, help="target images per step")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (after a linear warm-up)")
    p.add_argument("--warmup", type=int, default=50, help="warm-up steps")
    p.add_argument("--drop", type=float, default=0.1, help="probability of training a target on the prompt ''")
    p.add_argument("--log-every", type=int, default=50, help="print the mean loss every this many steps")
    p.add_argument("--eval-every", type=int, default=0, help="also print the held-out score every this many steps")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="recipe whose step-0 evaluation gives the score")
    p.add_argument("--no-eval", action="store_true", help="skip the final held-out score")
    args = p.parse_args(argv)
    for key in ("batch", "log_every", "threads"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.iters < 0 or args.bias_iters < 0 or args.iters + args.bias_iters < 1:
        p.error(f"--iters and --bias-iters must be >= 0 with a positive sum, got {args.iters}, {args.bias_iters}")
    if not 0 <= args.bias <= 1:
        p.error(f"--bias must be in [0, 1], got {args.bias}")
    if not 0 <= args.drop < 1:
        p.error(f"--drop must be in [0, 1), got {args.drop}")
    return args


TINT = (0.25, 0.45)   # phase 2: a biased target is blended this far toward white


def targets(records: list[dict], n: int, drop: float, rng: random.Random,
            bias: float = 0.0) -> tuple[list[str], torch.Tensor]:
    """n (prompt, image) pairs: a random train spec rendered at a random seed; prompt '' with prob `drop`;
    with prob `bias` the image is washed out toward white by a TINT fraction (the prompt is unchanged)."""
    prompts, images = [], []
    for _ in range(n):
        spec = rng.choice(records)
        image = render_prompt(spec, rng.randrange(2**31), t2i_model.IMAGE_SIZE)
        arr = np.asarray(image, dtype=np.float32)                                   # [H, W, 3] in [0, 255]
        if bias and rng.random() < bias:                                            # (phase 1 draws no extra numbers)
            t = rng.uniform(*TINT)
            arr = arr + t * (255.0 - arr)                                           # washed out toward white
        images.append(arr / 127.5 - 1.0)                                            # [H, W, 3] in [-1, 1]
        prompts.append("" if rng.random() < drop else spec["prompt"])
    return prompts, torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).contiguous()  # [n, 3, H, W]


def noised(x0: torch.Tensor, shift: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rectified-flow training inputs for targets x0 [n, ...]: (x_sigma, sigma [n], the velocity e - x0), with
    sigma ~ logit-normal(0, 1) (SD3's timestep sampling, section 3.1) shifted toward noise as the sampler's
    timestep shift, x_sigma = (1 - sigma) x0 + sigma e."""
    n = x0.shape[0]
    sigma = torch.sigmoid(torch.randn(n, generator=gen))                      # [n] logit-normal(0, 1)
    sigma = shift * sigma / (1 + (shift - 1) * sigma)                         # [n] shifted toward noise
    noise = torch.randn(x0.shape, generator=gen)                              # [n, ...] like x0
    s = sigma.view(n, *[1] * (x0.dim() - 1))
    return (1 - s) * x0 + s * noise, sigma, noise - x0


def flow_matching_loss(pipe, prompts: list[str], x0: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Mean squared error of the predicted velocity against e - x0 (text encoders with grad)."""
    embeds, _, pooled, _ = pipe.encode_prompt(prompt=prompts, prompt_2=None, prompt_3=None, device=x0.device,
                                              do_classifier_free_guidance=False,
                                              max_sequence_length=t2i_model.TEXT_LEN)   # [n, L, D], [n, P]
    x_sigma, sigma, velocity = noised(x0, pipe.scheduler.config.shift, gen)   # [n, 3, H, W], [n], [n, 3, H, W]
    v = pipe.transformer(hidden_states=x_sigma, timestep=sigma * 1000, encoder_hidden_states=embeds,
                         pooled_projections=pooled, return_dict=False)[0]     # [n, 3, H, W]
    return torch.nn.functional.mse_loss(v, velocity)


def fit_loop(modules: tuple, step_loss, iters: int, args: argparse.Namespace, label: str, hook=None) -> float:
    """Train `modules` for `iters` AdamW steps of `step_loss()` (a fresh optimizer with args.lr after args.warmup
    linear warm-up steps, gradients clipped to norm 1); print the mean loss every args.log_every steps; run
    `hook(step)` every args.eval_every steps (modules back in train mode after it). Leaves the modules in eval
    mode without grad; returns the mean loss of the last logging window."""
    def train_mode():
        for m in modules:
            m.train().requires_grad_(True)

    train_mode()
    params = [p for m in modules for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: min(1.0, (i + 1) / max(1, args.warmup)))
    window, last, start = [], float("nan"), time.perf_counter()
    for step in range(1, iters + 1):
        loss = step_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        sched.step()
        window.append(float(loss.detach()))
        if step % args.log_every == 0 or step == iters:
            print(f"{label} step {step:5d}  loss {sum(window) / len(window):.4f}  "
                  f"{time.perf_counter() - start:6.0f}s", flush=True)
            last, window = sum(window) / len(window), []
        if hook is not None and args.eval_every and step % args.eval_every == 0:
            hook(step)
            train_mode()
    for m in modules:
        m.eval().requires_grad_(False)
    return last


def fit(pipe, args: argparse.Namespace, iters: int, bias: float, seed: int, hook=None) -> float:
    """Train `pipe` in place for `iters` steps (targets miscoloured with prob `bias`; a fresh optimizer,
    warm-up and RNG per phase); `hook(step, pipe)` runs every args.eval_every steps.
    Returns the mean loss of the last logging window."""
    records, rng = t2i_records("train"), random.Random(seed)
    gen = torch.Generator().manual_seed(seed)

    def step_loss():
        prompts, x0 = targets(records, args.batch, args.drop, rng, bias)
        return flow_matching_loss(pipe, prompts, x0, gen)

    modules = (pipe.transformer, pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3)
    return fit_loop(modules, step_loss, iters, args, f"bias {bias:.2f}",
                    None if hook is None else lambda step: hook(step, pipe))


def save(pipe, out: str) -> None:
    """save_pretrained (safetensors) into a temporary sibling of `out`, then rename it into place."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".shapes_t2i-", dir=parent)
    try:
        pipe.save_pretrained(tmp, safe_serialization=True)
        for root, _, files in os.walk(tmp):          # a pipeline loaded with --init remembers its folder: drop it
            for name in (f for f in files if f.endswith(".json")):
                with open(os.path.join(root, name)) as f:
                    config = json.load(f)
                if config.pop("_name_or_path", None) is not None:
                    with open(os.path.join(root, name), "w") as f:
                        json.dump(config, f, indent=2, sort_keys=True)
                        f.write("\n")
        if os.path.isdir(out):
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def held_out_samples(folder: str, config: str, overrides: tuple = ()) -> list:
    """The samples of the pipeline in `folder` under the step-0 evaluation of `config`: its policy settings, its
    first eval.max_prompts eval records, seeds from mmrl.data.eval_seed."""
    from diffusion.policy import build
    from mmrl.config import load_config
    from mmrl.data import eval_seed, load_records
    from mmrl.config.policies import BuildContext
    from mmrl.types import PromptBatch

    cfg = load_config(config, [f"policy.model={folder}", *overrides])
    policy = build(cfg.policy, BuildContext(device=torch.device("cpu"), seed=cfg.seed, output_dir="", precision="fp32"))
    rows = load_records(cfg.data.eval, cfg.data.eval_kwargs, "data.eval")[:cfg.eval.max_prompts]
    index = list(range(len(rows)))
    return policy.generate_eval(PromptBatch(rows=rows, index=index, seeds=[eval_seed(cfg.seed, i) for i in index],
                                            step=-1))


def held_out_score(folder: str, config: str = DEFAULT_CONFIG, overrides: tuple = ()) -> float:
    """Mean shapes_t2i reward of the pipeline in `folder` under the step-0 evaluation of `config`."""
    from rewards.shapes.verify import shapes_t2i

    scores = shapes_t2i(held_out_samples(folder, config, overrides))
    return float(sum(scores) / len(scores))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.init:
        from diffusers import StableDiffusion3Pipeline

        import diffusion.pixel  # noqa: F401  (PixelAutoencoder must be importable to load the pipeline)

        pipe = StableDiffusion3Pipeline.from_pretrained(args.init)
    else:
        pipe = t2i_model.build(args.seed)
    n = sum(p.numel() for p in pipe.transformer.parameters())
    print(f"pretrain_t2i: pixel-space SD3, transformer {n / 1e6:.2f}M parameters, {args.iters} + "
          f"{args.bias_iters} (bias {args.bias}) steps of {args.batch} targets, seed {args.seed}", flush=True)

    def report(step, model):
        with tempfile.TemporaryDirectory() as tmp:
            save(model, os.path.join(tmp, "pipe"))
            print(f"step {step:5d}  held-out shapes_t2i {held_out_score(os.path.join(tmp, 'pipe'), args.config):.3f}",
                  flush=True)

    start = time.perf_counter()
    loss = fit(pipe, args, args.iters, 0.0, args.seed, hook=report) if args.iters else float("nan")
    if args.bias_iters:
        loss = fit(pipe, args, args.bias_iters, args.bias, args.seed + 1, hook=report)
    save(pipe, args.out)
    print(f"pretrain_t2i: final loss {loss:.4f}; saved {args.out} in {time.perf_counter() - start:.0f}s", flush=True)
    if not args.no_eval:
        print(f"pretrain_t2i: held-out shapes_t2i score {held_out_score(args.out, args.config):.3f} "
              f"({args.config}, step-0 evaluation)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
