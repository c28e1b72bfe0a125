"""The DiffusionNFT text-to-image default (configs/tiny/t2i_shapes_nft.yaml): a shortened run raises the
held-out reward of the pretrained pixel-space SD3 without painting stray pixels."""

from __future__ import annotations

import os

from mmrl.summary import read_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "tiny", "t2i_shapes_nft.yaml")
SHORT_STEPS = 10          # the shortened default (the full one trains 30 steps)
SHORT_MARGIN = 0.25       # eval/reward/mean(step 10) - eval/reward/mean(step 0): measured +0.39 for seed 0
MAX_STRAY = 0.10          # eval/quality/shapes_stray: measured 0.016 at step 10 (0.043 at step 0)


def test_shortened_default_raises_the_held_out_reward_without_stray_pixels(tmp_path, eval_curve_of):
    curve = eval_curve_of(CONFIG, tmp_path, f"max_steps={SHORT_STEPS}", f"eval.every={SHORT_STEPS}")
    (first_step, first), (last_step, last) = curve[0], curve[-1]
    assert (first_step, last_step) == (0, SHORT_STEPS), curve
    assert last - first >= SHORT_MARGIN, f"held-out reward {first:.3f} -> {last:.3f} (want +{SHORT_MARGIN})"
    stray = [r["eval/quality/shapes_stray"] for r in read_rows(str(tmp_path)) if r["step"] == SHORT_STEPS]
    assert stray and stray[-1] <= MAX_STRAY, stray
    assert all(r["nft/old_decay"] == min(0.001 * r["step"], 0.5) for r in read_rows(str(tmp_path)) if "loss" in r)
