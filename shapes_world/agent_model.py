"""The FrozenLake agent VLM of `configs/tiny/agent_frozenlake.yaml`: a tiny Qwen2.5-VL with a tokenizer
over the words its episodes use.

Built offline, in code, with a fixed seed from the recipes of `vlm/tiny.py` (same tokenizer, processor
and config recipe as `tiny:qwen2_5_vl`, its own corpus), then pretrained on a teacher's episodes by
`python -m shapes_world.pretrain_agent` and committed as `assets/tiny/frozenlake_agent`.
Images: a 4x4 lake drawn at 112x112 (28 px a cell, envs/frozenlake.py) stays 112x112 (policy.min_pixels
= max_pixels = 112**2): 8x8 patches of 14 px merged 2x2 into 16 image tokens, one per cell.
"""

from __future__ import annotations

from envs.frozenlake import ACTIONS, instructions
from shapes_world import vlm_model
from shapes_world.vlm_model import save  # noqa: F401  (the same save_pretrained layout)
from vlm import tiny

FORMAT_PROMPT = "{prompt} Reply as <answer> action </answer>."
# env.instructions of the config: short, so an episode's context stays small
INSTRUCTIONS = "Move the red dot to the green goal. Dark blue cells are holes. Actions: left, down, right, up."
MODEL_SIDE = vlm_model.MODEL_SIDE      # 112
VOCAB_SIZE = 400


def corpus() -> list[str]:
    """Every phrase an episode shows or the model writes (the BPE training text)."""
    lines = ["system user assistant You are a helpful assistant.", FORMAT_PROMPT.replace("{prompt}", ""),
             INSTRUCTIONS, instructions(False), "Your reply had no valid action. Reward: -0.1."]
    for action in ACTIONS:
        lines += [f"<answer>{action}</answer>", f"You chose {action}. Reward: 0.", f"You chose {action}. Reward: 1."]
    return lines


def build(seed: int = 0):
    """(model, processor): a randomly initialised tiny Qwen2.5-VL (the shapes world's recipe, `vlm_model.build`)
    over this corpus's tokenizer, with room for 1024 positions (an episode's context)."""
    return vlm_model.build(seed, tiny.qwen2_5_vl_tokenizer(corpus(), VOCAB_SIZE), max_positions=1024)
