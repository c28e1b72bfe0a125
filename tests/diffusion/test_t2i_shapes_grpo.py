"""The policy-gradient recipe of the text-to-image default (configs/tiny/t2i_shapes_grpo.yaml): a shortened
run (constant lr, no warm-up) raises the held-out reward of the pretrained pixel-space SD3 while its guards
keep the background clean."""

from __future__ import annotations

import os

import pytest

from mmrl.reporting.summary import read_rows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "tiny", "t2i_shapes_grpo.yaml")
SHORT_STEPS = 20          # the shortened recipe (the full one trains 160 steps, with warm-up and cosine decay)
SHORT = [f"max_steps={SHORT_STEPS}", f"eval.every={SHORT_STEPS}", "optim.warmup_steps=0", "optim.schedule=constant"]
SHORT_MARGIN = 0.15       # eval/reward/mean(step 20) - eval/reward/mean(step 0): measured +0.21 for seed 0 (+0.23 at
                          # 30, +0.26 at 40)
MAX_STRAY = 0.10          # eval/quality/shapes_stray at step 20: measured 0.029 (0.043 at step 0; 0.024 at 30)

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_shortened_grpo_recipe_raises_the_held_out_reward_with_a_clean_background(tmp_path, eval_curve_of):
    curve = eval_curve_of(CONFIG, tmp_path, *SHORT)
    (first_step, first), (last_step, last) = curve[0], curve[-1]
    assert (first_step, last_step) == (0, SHORT_STEPS), curve
    assert last - first >= SHORT_MARGIN, f"held-out reward {first:.3f} -> {last:.3f} (want +{SHORT_MARGIN})"
    stray = [r["eval/quality/shapes_stray"] for r in read_rows(str(tmp_path)) if "eval/quality/shapes_stray" in r]
    assert stray[-1] <= MAX_STRAY, stray
