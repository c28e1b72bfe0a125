"""Pretrain the shapes-world text-to-video model (shapes_world/t2v_model.py), then spoil it with an imperfect teacher.

    python -m shapes_world.pretrain_t2v --seed 0 --out assets/tiny/shapes_t2v

Supervised conditional flow matching over clips (rectified flow, as Wan is trained): for a target clip x0 (a
`render_clip` of a random train prompt of shapes_world/motion.py: 5 frames of 16 x 16, the shapes moving 2 px per
frame the named way), noise e and sigma ~ logit-normal(0, 1) shifted as the sampler's flow shift, the transformer
sees x_sigma = (1 - sigma) x0 + sigma e at timestep 1000 sigma and regresses v = e - x0. The UMT5 text encoder
stays frozen at its random initialisation, as Wan's (pretrained) UMT5 stays frozen; a prompt is replaced by ""
with probability `--drop` (the unconditional branch).

Two phases, so that the RL default (configs/tiny/t2v_shapes.yaml) starts from a model that knows how to move the
shapes either way but picks the way at random, a deficit the motion verifier sees:
  1. `--rounds` rounds of `--iters` steps on clips that move the asked way (each round a fresh optimizer and
     warm-up, seeded seed + round): the model learns the colour, count and kind of the shapes, then the axis of
     the motion (held-out motion accuracy about 0.2 until step 2000, 0.5 at step 5000), then the way along it
     (0.65 at 8000, 0.96 at 10000 in our run);
  2. `--reverse-iters` steps where the teacher plays each clip backwards with probability `--reverse` (the prompt
     unchanged), so "a red circle moving right" is as often shown moving left: the held-out accuracy falls back
     to about 0.5 while colour, count, kind and axis stay.
Trained jointly with the transformer, the text encoder collapsed "left" and "right" (and "up" and "down") into
one embedding (cosine 0.99 where the random encoder gives 0.06) before the transformer could use the difference,
and the model never learnt the way (held-out accuracy about 0.5 after 9000 steps; for one seed, "moving right"
and "moving left" gave the same clip): hence the frozen encoder.
assets/tiny/shapes_t2v is the output of the command above, run in its three parts (`--rounds 1
--reverse-iters 0` at seed 0; then `--init` of that with `--seed 1 --rounds 1 --reverse-iters 0`; then `--init`
of that with `--seed 2 --iters 0`: each part depends only on its starting weights and seed, and the parts write
the weights the one command writes, which tests/diffusion/test_t2v_shapes_default.py checks), about 37 minutes
on one CPU core. The script prints
the loss every `--log-every` steps and, at the end, the held-out motion accuracy (`shapes_motion_direction`) and
score (`shapes_motion`) of the saved pipeline under the step-0 evaluation of `--config`. The output is a diffusers
folder (save_pretrained, safetensors), written to a temporary folder beside `--out` and renamed into place.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import numpy as np
import torch

from shapes_world import t2v_model
from shapes_world.motion import render_clip, t2v_records
from shapes_world.pretrain_t2i import fit_loop, held_out_samples, noised, save

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "configs", "tiny", "t2v_shapes.yaml")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m shapes_world.pretrain_t2v", description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="output pipeline folder (replaced if it exists)")
    p.add_argument("--seed", type=int, default=0, help="seed of the initial weights, the targets and the noise")
    p.add_argument("--iters", type=int, default=5000, help="phase 1: optimizer steps on clips that satisfy their prompt")
    p.add_argument("--rounds", type=int, default=2, help="phase 1 runs in this many rounds of --iters steps, each "
                                                        "with a fresh optimizer and warm-up")
    p.add_argument("--reverse-iters", type=int, default=600, help="phase 2: steps on clips played backwards with "
                                                                  "prob --reverse")
    p.add_argument("--reverse", type=float, default=0.5, help="phase 2: probability a target clip plays backwards")
    p.add_argument("--init", default=None, help="start from this saved pipeline instead of a fresh one (with "
                                                "--iters 0: phase 2 alone, as the full command would run it)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--batch", type=int, default=32, help="target clips per step")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (after a linear warm-up)")
    p.add_argument("--warmup", type=int, default=50, help="warm-up steps")
    p.add_argument("--drop", type=float, default=0.1, help="probability of training a target on the prompt ''")
    p.add_argument("--log-every", type=int, default=50, help="print the mean loss every this many steps")
    p.add_argument("--eval-every", type=int, default=0, help="also print the held-out accuracy every this many steps")
    p.add_argument("--config", default=DEFAULT_CONFIG, help="recipe whose step-0 evaluation gives the accuracy")
    p.add_argument("--no-eval", action="store_true", help="skip the final held-out evaluation")
    args = p.parse_args(argv)
    for key in ("batch", "log_every", "threads", "rounds"):
        if getattr(args, key) < 1:
            p.error(f"--{key.replace('_', '-')} must be >= 1, got {getattr(args, key)}")
    if args.iters < 0 or args.reverse_iters < 0 or args.iters + args.reverse_iters < 1:
        p.error(f"--iters and --reverse-iters must be >= 0 with a positive sum, got {args.iters}, "
                f"{args.reverse_iters}")
    if not 0 <= args.reverse <= 1:
        p.error(f"--reverse must be in [0, 1], got {args.reverse}")
    if not 0 <= args.drop < 1:
        p.error(f"--drop must be in [0, 1), got {args.drop}")
    return args


def targets(records: list[dict], n: int, drop: float, rng: random.Random,
            reverse: float = 0.0) -> tuple[list[str], torch.Tensor]:
    """n (prompt, clip) pairs: a random train spec drawn at a random seed; prompt '' with prob `drop`; with prob
    `reverse` the clip played backwards (the shapes move the other way; the prompt is unchanged)."""
    prompts, clips = [], []
    for _ in range(n):
        spec = rng.choice(records)
        clip = render_clip(spec, rng.randrange(2**31), t2v_model.SIZE, t2v_model.FRAMES, t2v_model.STEP)
        frames = [np.asarray(f, dtype=np.float32) for f in clip.frames]              # F x [H, W, 3] in [0, 255]
        if rng.random() < reverse:
            frames = frames[::-1]
        clips.append(np.stack(frames) / 127.5 - 1.0)                                 # [F, H, W, 3] in [-1, 1]
        prompts.append("" if rng.random() < drop else spec["prompt"])
    return prompts, torch.from_numpy(np.stack(clips)).permute(0, 4, 1, 2, 3).contiguous()   # [n, 3, F, H, W]


def flow_matching_loss(pipe, prompts: list[str], x0: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Mean squared error of the predicted velocity against e - x0 (the text encoder frozen: no grad through it)."""
    embeds, _ = pipe.encode_prompt(prompt=prompts, do_classifier_free_guidance=False, device=x0.device,
                                   max_sequence_length=t2v_model.TEXT_LEN)            # [n, L, D]
    x_sigma, sigma, velocity = noised(x0, t2v_model.SHIFT, gen)                       # [n, 3, F, H, W], [n], ...
    v = pipe.transformer(hidden_states=x_sigma, timestep=sigma * 1000, encoder_hidden_states=embeds,
                         return_dict=False)[0]                                         # [n, 3, F, H, W]
    return torch.nn.functional.mse_loss(v, velocity)


def fit(pipe, args: argparse.Namespace, iters: int, reverse: float, seed: int, hook=None) -> float:
    """Train `pipe` in place for `iters` steps (targets played backwards with prob `reverse`; a fresh optimizer,
    warm-up and RNG per phase); `hook(step, pipe)` runs every args.eval_every steps. Returns the last logging
    window's mean loss."""
    torch.manual_seed(seed)     # no step draws from the global RNG today; seeded so a phase stays a function of its
                                # starting weights and seed should one (a dropout) ever do
    records, rng = t2v_records("train"), random.Random(seed)
    gen = torch.Generator().manual_seed(seed)

    def step_loss():
        prompts, x0 = targets(records, args.batch, args.drop, rng, reverse)
        return flow_matching_loss(pipe, prompts, x0, gen)

    pipe.text_encoder.eval().requires_grad_(False)      # frozen, as Wan's UMT5 is (module docstring)
    return fit_loop((pipe.transformer,), step_loss, iters, args, f"reverse {reverse:.2f}",
                    None if hook is None else lambda step: hook(step, pipe))


def held_out(folder: str, config: str = DEFAULT_CONFIG, overrides: tuple = ()) -> dict[str, float]:
    """Mean motion accuracy and motion score of the pipeline in `folder` under the step-0 evaluation of `config`
    (pretrain_t2i.held_out_samples)."""
    from rewards.shapes.motion import shapes_motion, shapes_motion_direction

    samples = held_out_samples(folder, config, overrides)
    direction, score = shapes_motion_direction(samples), shapes_motion(samples)
    return {"accuracy": float(np.mean(direction)), "score": float(np.mean(score))}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.init:
        from diffusers import WanPipeline

        import diffusion.pixel  # noqa: F401  (PixelVideoAutoencoder must be importable to load the pipeline)

        pipe = WanPipeline.from_pretrained(args.init)
    else:
        pipe = t2v_model.build(args.seed)
    n = sum(p.numel() for p in pipe.transformer.parameters())
    print(f"pretrain_t2v: pixel-space Wan, transformer {n / 1e6:.2f}M parameters, {args.rounds} x {args.iters} + "
          f"{args.reverse_iters} (reverse {args.reverse}) steps of {args.batch} clips, seed {args.seed}", flush=True)

    def report(step, model):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            save(model, os.path.join(tmp, "pipe"))
            got = held_out(os.path.join(tmp, "pipe"), args.config)
            print(f"step {step:5d}  held-out motion accuracy {got['accuracy']:.3f}  score {got['score']:.3f}",
                  flush=True)

    start = time.perf_counter()
    loss = float("nan")
    for r in range(args.rounds if args.iters else 0):                    # phase 1, round r seeded seed + r
        loss = fit(pipe, args, args.iters, 0.0, args.seed + r, hook=report)
    if args.reverse_iters:                                               # phase 2, seeded after the rounds
        loss = fit(pipe, args, args.reverse_iters, args.reverse, args.seed + (args.rounds if args.iters else 0),
                   hook=report)
    save(pipe, args.out)
    print(f"pretrain_t2v: final loss {loss:.4f}; saved {args.out} in {time.perf_counter() - start:.0f}s", flush=True)
    if not args.no_eval:
        got = held_out(args.out, args.config)
        print(f"pretrain_t2v: held-out motion accuracy {got['accuracy']:.3f}, shapes_motion {got['score']:.3f} "
              f"({args.config}, step-0 evaluation)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
